"""The batch-aware draft lengths on their own: no model needed."""

from specstruct.config import SpecConfig
from specstruct.spec.batch_policy import Demand, allocate, goodput, pass_time, probe_trimmed
from specstruct.spec.policy import PROBE_EVERY, AdaptivePolicy

ALL = {"forced", "lookup", "model"}


def _policy(t1: float, slope: float, draft: float) -> AdaptivePolicy:
    pol = AdaptivePolicy(SpecConfig(), ALL)
    for rows in (1, 2, 4, 8, 16, 32, 64):
        pol.observe_cost("target", rows, t1 * (1 + slope * (rows - 1)))
    pol.observe_cost("draft", 1, draft)
    return pol


def test_a_lone_row_keeps_its_own_policy_length():
    pol = _policy(0.4, 0.5, 0.1)  # even where batching would cut drafts, a lone request drafts as today
    assert allocate(pol, [Demand(1, 6, 0.9)]) == [6]


def test_never_below_plain_batched_decoding():
    pol = _policy(0.4, 0.07, 0.1)
    for rate in (0.1, 0.5, 0.9):
        demands = [Demand(1 + i % 3, 8, rate) for i in range(8)]
        ks = allocate(pol, demands)
        assert goodput(pol, demands, ks) >= goodput(pol, demands, [0] * 8)


def test_drafts_shrink_as_rows_get_expensive():
    cheap, dear = _policy(0.4, 0.03, 0.05), _policy(0.4, 0.6, 0.05)
    demands = [Demand(1, 8, 0.8) for _ in range(8)]
    assert sum(allocate(cheap, demands)) > sum(allocate(dear, demands))
    assert sum(allocate(cheap, demands)) > 0


def test_poor_acceptance_drafts_nothing_and_fixed_rows_keep_theirs():
    pol = _policy(0.4, 0.07, 0.15)
    ks = allocate(pol, [Demand(1, 8, 0.05), Demand(1, 8, 0.05), Demand(1, 4, 0.05, fixed=True)])
    assert ks == [0, 0, 4]


def test_pass_time_interpolates_measured_points():
    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("target", 2, 1.0)
    pol.observe_cost("target", 10, 2.0)
    assert pass_time(pol, 6) == 1.5
    assert pass_time(pol, 2) == 1.0 and pass_time(pol, 20) > 2.0


def test_a_drafter_the_batch_always_trims_is_probed_now_and_then():
    """Trimmed away in every pass, lookup would never be judged again and its rate never recover: every
    PROBE_EVERY passes its first candidate is verified anyway (forced text, before it, too)."""
    pol = AdaptivePolicy(SpecConfig(), ALL)
    segments = [("forced", 2), ("lookup", 3)]
    kept = [probe_trimmed(pol, [("json", segments, 1)])[0] for _ in range(2 * PROBE_EVERY)]
    assert kept.count(3) == 2 and kept[PROBE_EVERY - 1] == 3 and set(kept) == {1, 3}
    assert probe_trimmed(pol, [("json", segments, 4)]) == [4] and pol.idle_steps[("json", "lookup")] == 0  # judged


def test_probes_count_row_steps_and_probe_one_row():
    """Eight rows that all trim lookup are eight row steps without it (as eight lone rows' steps would be): the
    probe comes every PROBE_EVERY / 8 passes, in one row only; a pass in which any row judged lookup resets the
    count."""
    pol = AdaptivePolicy(SpecConfig(), ALL)
    segments = [("forced", 2), ("lookup", 3)]
    passes = [probe_trimmed(pol, [("json", segments, 1)] * 8) for _ in range(PROBE_EVERY)]
    probed = [i for i, p in enumerate(passes) if p != [1] * 8]
    assert probed == list(range(PROBE_EVERY // 8 - 1, PROBE_EVERY, PROBE_EVERY // 8))
    assert all(passes[i] == [3] + [1] * 7 for i in probed)
    pol.idle_steps.clear()  # seven rows: 7, 14, 21 -> a probe, 5 carried over, 12, 19 -> a probe, 3, ...
    sevens = [probe_trimmed(pol, [("json", segments, 1)] * 7) != [1] * 7 for _ in range(16)]
    assert sum(sevens) == 16 * 7 // PROBE_EVERY  # a probe every PROBE_EVERY row steps on average
    pol.idle_steps[("json", "lookup")] = PROBE_EVERY - 1
    assert probe_trimmed(pol, [("json", segments, 1), ("json", segments, 4)]) == [1, 4]  # judged by the second row
    assert pol.idle_steps[("json", "lookup")] == 0
