"""The batch-aware draft lengths on their own: no model needed."""

from specstruct.config import SpecConfig
from specstruct.spec.batch_policy import Demand, allocate, goodput, probe_trimmed
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
    assert pol.pass_seconds(6) == 1.5
    assert pol.pass_seconds(2) == 1.0 and pol.pass_seconds(20) > 2.0


def test_past_the_widest_measured_pass_the_measured_slope_extrapolates():
    """Passes a lone row measures (1-9 rows) predict a batch's wide ones from their own slope, not the prior's: on a
    2-core Zen 4 EPYC (AVX-512 VNNI, no AMX) T(r) was 36.7, 42.9, 50.7, 76.4 ms at 1, 3, 5, 9 rows and 168.4 and
    315.6 ms at 24 and 48 (`python -m benchmarks.step_cost --ks 1,3,5,9,16,24,48 --prefill 0`); the prior's slope
    put 24 and 48 rows 24% and 33% low."""
    from specstruct.spec.policy import PRIOR_VERIFY_SLOPE

    pol = AdaptivePolicy(SpecConfig(), ALL)
    for rows, seconds in ((1, 0.0367), (3, 0.0429), (5, 0.0507), (9, 0.0764)):
        pol.observe_cost("target", rows, seconds)
    for rows, seconds in ((24, 0.1684), (48, 0.3156)):
        assert abs(pol.pass_seconds(rows) / seconds - 1) < 0.1
        prior = 0.0764 + 0.0367 * PRIOR_VERIFY_SLOPE * (rows - 9)
        assert prior / seconds < 0.8
    assert pol.verify_ratio(48) == pol.pass_seconds(48) / 0.0367  # one estimator for the lone row and the batch
    assert pol.pass_seconds(7) == (0.0507 + 0.0764) / 2  # between measured counts: the line through them


def test_a_noisy_or_lone_measurement_never_makes_wider_passes_cheaper():
    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("target", 4, 0.050)
    assert pol.pass_seconds(8) > 0.050  # one count: the prior slope
    pol.observe_cost("target", 8, 0.045)  # noise: the wider pass measured faster
    assert pol.pass_seconds(16) == 0.045  # a slope below zero is taken as none
    assert pol.t1() is not None and pol.t1() < 0.050
    assert AdaptivePolicy(SpecConfig(), ALL).t1() is None


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
