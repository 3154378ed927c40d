"""The prefill budget rule on its own: no model needed."""

import pytest

from specstruct.config import SpecConfig
from specstruct.spec.batch_policy import pass_time
from specstruct.spec.policy import AdaptivePolicy
from specstruct.spec.prefill_budget import IDLE_PREFILL, PASS_TOKENS, prefill_budget


def linear(fixed: float = 0.45, per_token: float = 0.022):
    """A CPU pass: a fixed cost (weights read once per pass) plus compute per token (the real pair's shape)."""
    return lambda n: fixed + per_token * n


def test_nobody_decoding_reads_the_idle_budget():
    assert prefill_budget(32, 8, 0, 0, linear()) == IDLE_PREFILL
    assert prefill_budget(10**9, 1, 0, 0, linear()) == 10**9  # a larger floor is the caller's choice


@pytest.mark.parametrize("prefilling,decoding", [(1, 3), (1, 1), (1, 2), (2, 6)])
def test_a_prompt_joining_running_rows_gets_the_floor_on_the_real_pairs_costs(prefilling, decoding):
    """A long prompt joining decoding rows: steps of at most 1 + P/D decode steps, which on the real pair's cost
    shape is fewer tokens than the latency-first floor, so the floor it is."""
    assert prefill_budget(32, prefilling, decoding, 9 * decoding, linear()) == 32
    assert 16 <= prefill_budget(16, prefilling, decoding, 9 * decoding, linear()) < 32


def test_where_a_pass_costs_little_per_token_even_one_prompt_gets_more():
    assert prefill_budget(32, 1, 3, 27, linear(5.0, 0.001)) == IDLE_PREFILL


def test_step_grows_to_1_plus_p_over_d_decode_steps_and_no_further():
    cost, d = linear(), 9
    for p, dec in [(2, 1), (4, 1), (7, 1), (6, 2), (5, 3), (4, 4)]:
        b = prefill_budget(32, p, dec, d, cost)
        bound = cost(d) * (1 + p / dec)
        assert dec * (cost(d + b) - cost(d)) <= p * cost(d) + 1e-12 or b == 32  # row-seconds, either way
        assert b >= 32
        if b < min(IDLE_PREFILL, PASS_TOKENS - d):
            assert cost(d + b + 1) > bound  # the largest such budget
    # 1 row decoding 9 tokens (0.648 s), 4 prompts waiting: steps up to 3.24 s, i.e. 117 prompt tokens
    assert prefill_budget(32, 4, 1, 9, cost) == 117
    assert prefill_budget(32, 7, 1, 9, cost) == 206  # 7 waiting: steps up to 5.18 s


def test_budget_grows_with_the_queue():
    cost = linear()
    budgets = [prefill_budget(32, p, 2, 18, cost) for p in range(1, 9)]
    assert budgets == sorted(budgets) and budgets[0] == 32 and budgets[-1] > 100


def test_never_past_the_row_invariant_pass_size():
    cheap = linear(1.0, 1e-6)  # everything fits the time bound: the caps decide
    assert prefill_budget(32, 8, 1, 4, cheap) == IDLE_PREFILL
    assert prefill_budget(32, 8, 1, 120, cheap) == PASS_TOKENS - 120
    assert prefill_budget(32, 8, 1, 290, cheap) == 32  # the floor even past the cap
    assert prefill_budget(32, 1, 4, 40, linear(0.0, 1.0)) == 32  # nor where the floor already breaks the bound


def test_works_in_the_policys_relative_units_before_anything_was_measured():
    pol = AdaptivePolicy(SpecConfig(), {"model"})
    b = prefill_budget(32, 7, 1, 9, lambda n: pass_time(pol, n))
    assert 32 < b <= IDLE_PREFILL
    pol.observe_cost("target", 9, 0.65)
    pol.observe_cost("target", 300, 7.0)  # measured: interpolated between the two
    b = prefill_budget(32, 7, 1, 9, lambda n: pass_time(pol, n))
    assert pass_time(pol, 9 + b) <= 8 * 0.65 < pass_time(pol, 10 + b)
