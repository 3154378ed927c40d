"""The candidate policy on its own: no model needed."""

from specstruct.config import SpecConfig
from specstruct.spec.policy import PROBE_EVERY, AdaptivePolicy, RowRates, expected_tokens
from specstruct.testing import draft_first

ALL = {"forced", "lookup", "guess", "model"}


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 3) == 4.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def test_mode_caps_and_initial_length():
    pol = draft_first(AdaptivePolicy(SpecConfig(), ALL))
    json_plan, text_plan = pol.plan("json"), pol.plan("text")
    assert json_plan.k == 8 and text_plan.k == 2
    assert json_plan.limits["model"] == 3  # initial_candidates
    assert text_plan.limits["model"] <= 2
    assert json_plan.drafters == ["forced", "lookup", "guess", "model"]


def test_speculation_off_plans_nothing():
    assert AdaptivePolicy(SpecConfig(enable_speculative=False), ALL).plan("json").k == 0


def test_grows_above_threshold_and_shrinks_below():
    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.plan("json")
    for _ in range(10):
        pol.observe("json", "model", 3, 3)
    assert pol.k[("json", "model")] == 8  # capped by the JSON cap
    for _ in range(10):
        pol.observe("json", "model", 4, 0)
    assert pol.k[("json", "model")] == 1


def test_cost_gate_turns_the_draft_model_off_when_it_cannot_pay():
    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("target", 1, 1.0)
    for rows in range(2, 10):
        pol.observe_cost("target", rows, 1.0 + 0.05 * rows)
    pol.observe_cost("draft", 1, 0.9)  # a draft almost as slow as the target
    for _ in range(5):
        pol.observe("json", "model", 3, 1)
    assert pol.best_k("json", 8) == 0
    cheap = AdaptivePolicy(SpecConfig(), ALL)
    cheap.observe_cost("target", 1, 1.0)
    cheap.observe_cost("draft", 1, 0.1)
    for _ in range(5):
        cheap.observe("json", "model", 3, 3)
    assert cheap.best_k("json", 8) >= 4


def test_probe_reenables_a_switched_off_drafter():
    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("target", 1, 1.0)
    pol.observe_cost("draft", 1, 2.0)
    draft_first(pol)
    limits = [pol.plan("json").limits.get("model", 0) for _ in range(40)]
    assert limits.count(0) > 30 and 1 in limits


def test_switches_in_config_disable_drafters():
    pol = AdaptivePolicy(SpecConfig(use_draft_model=False, use_prompt_lookup=False, use_structure_guesses=False), ALL)
    assert pol.plan("json").drafters == ["forced"]


def test_the_draft_model_must_beat_the_free_drafters_as_measured():
    from specstruct.spec.policy import ARM_TOKENS, PROBE_ARM_EVERY

    pol = AdaptivePolicy(SpecConfig(), ALL)
    assert "model" not in pol.plan("json").drafters  # first the free drafters alone are measured ...
    pol.observe_step("json", False, ARM_TOKENS, 1.0)
    assert pol.model_verdict("json") == "explore-with"
    assert pol.plan("json").limits["model"] > 0  # ... then the draft model
    pol.observe_step("json", True, ARM_TOKENS, 2.0)  # its prompt reading made it slow: 1/12 s per token
    assert pol.model_verdict("json") == "off" and pol.model_verdict("code") == "explore-without"  # per mode
    plans = [pol.plan("json") for _ in range(PROBE_ARM_EVERY)]
    assert sum("model" in p.drafters for p in plans) == 1  # tried again now and then
    pol.observe_step("json", True, 10 * ARM_TOKENS, 0.5)  # it got faster (a warm draft, say)
    assert pol.model_verdict("json") == "on" and "model" in pol.plan("json").drafters


def _free_arm(pol, mode, steps, tokens_per_step, seconds_per_step):
    for _ in range(steps):
        pol.observe_step(mode, False, tokens_per_step, seconds_per_step)


def test_a_draft_step_slower_than_a_free_token_is_never_tried():
    """The free drafters at 9 ms an output token against a 12 ms draft step: no acceptance rate could make the draft
    pay (policy docstring), so it is neither tried nor probed; where they are slow (25 ms a token) it is tried."""
    from specstruct.spec.policy import ARM_TOKENS, PROBE_ARM_EVERY

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("draft-timed", 1, 0.012)  # as the Speculator times it when built
    _free_arm(pol, "json", ARM_TOKENS // 3, 3, 3 * 0.009)
    assert pol.model_verdict("json") == "off"
    assert not any("model" in pol.plan("json").drafters for _ in range(2 * PROBE_ARM_EVERY))  # nor probed
    _free_arm(pol, "text", ARM_TOKENS, 1, 0.025)
    assert pol.model_verdict("text") == "explore-with" and "model" in pol.plan("text").drafters
    # a batch leaves the draft to the batch policy's costs unless lone rows ruled it out
    assert "model" not in pol.plan("json", alone=False).drafters and "model" in pol.plan("code", alone=False).drafters


def test_a_draft_that_promises_too_little_is_not_tried():
    """Prose as measured on the 2-core Xeon: a plain step 40 ms giving 1.05 tokens, a draft step 20 ms (half a target
    step) and a second row 1 ms. At the prior acceptance (adaptive_threshold 0.7) one draft token would give 1.75
    tokens for 61 ms: 8% over the free drafters, short of TRIAL_GAIN, so the draft's trial (its prompt reading, and
    steps at a loss if it is accepted less) is not paid for. A draft three times cheaper is tried."""
    from specstruct.spec.policy import ARM_TOKENS, TRIAL_GAIN

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("draft-timed", 1, 0.020)
    for rows in range(1, 10):
        pol.observe_cost("target", rows, 0.040 + 0.001 * (rows - 1))
    _free_arm(pol, "text", ARM_TOKENS, 1.05, 0.040)
    assert 1.0 < pol.trial_gain("text") < TRIAL_GAIN
    assert pol.model_verdict("text") == "off" and "model" not in pol.plan("text").drafters
    assert pol.trial_gain("text", rate=0.9) > TRIAL_GAIN  # a draft that agrees 9 times in 10 would be worth a try
    cheap = AdaptivePolicy(SpecConfig(), ALL)
    cheap.observe_cost("draft-timed", 1, 0.007)
    for rows in range(1, 10):
        cheap.observe_cost("target", rows, 0.040 + 0.001 * (rows - 1))
    _free_arm(cheap, "text", ARM_TOKENS, 1.05, 0.040)
    assert cheap.trial_gain("text") > TRIAL_GAIN and cheap.model_verdict("text") == "explore-with"


def test_the_trial_gain_matches_the_cost_model():
    """(t0 + E(a, k) - 1) / (P0 + k * e) against t0 / P0, the best k in 1..cap."""
    from specstruct.spec.policy import ARM_TOKENS

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("draft-timed", 1, 0.5)
    pol.observe_cost("target", 1, 1.0)
    pol.observe_cost("target", 9, 1.0)  # rows free: e is the draft step alone
    _free_arm(pol, "text", ARM_TOKENS, 1, 1.0)
    a = 0.7
    want = max((1 + expected_tokens(a, k) - 1) / (1 + 0.5 * k) for k in (1, 2))
    assert abs(pol.trial_gain("text", rate=a) - want) < 1e-9
    assert pol.trial_gain("json") == float("inf")  # nothing measured in JSON yet: no basis to rule it out


def test_a_measured_draft_win_overrides_the_cost_model():
    """Forced tokens a draft appends without a draft step can make it pay where the cost model says it cannot: once
    both arms are measured, the measurement decides."""
    from specstruct.spec.policy import ARM_TOKENS

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("draft-timed", 1, 0.012)
    _free_arm(pol, "json", ARM_TOKENS // 3, 3, 3 * 0.009)
    assert pol.model_verdict("json") == "off"
    pol.observe_step("json", True, 4 * ARM_TOKENS, 4 * ARM_TOKENS * 0.004)  # (a probe, say) measured faster
    assert pol.model_verdict("json") == "on" and "model" in pol.plan("json").drafters


def test_plans_without_timing_ignore_the_measured_arms():
    from specstruct.spec.policy import ARM_TOKENS

    pol = AdaptivePolicy(SpecConfig(), ALL, use_timing=False)  # seeded sampling: plans from acceptance alone
    pol.observe_step("json", True, ARM_TOKENS, 9.0)
    pol.observe_step("json", False, ARM_TOKENS, 1.0)
    assert pol.plan("json").limits["model"] > 0


def test_a_batched_pass_verifies_only_the_free_candidates_that_pay():
    from specstruct.spec.batch_policy import free_lengths

    pol = AdaptivePolicy(SpecConfig(), ALL)
    for rows in range(1, 41):  # a compute-bound pass: every row costs 6% of a one-row pass
        pol.observe_cost("target", rows, 0.050 * (1 + 0.06 * (rows - 1)) if rows > 8 else 0.050 + 0.003 * (rows - 1))
    forced, lookup = [0.97] * 3, [0.4] * 4
    keep = free_lengths(pol, [forced + lookup] * 8, [False] * 8)
    assert all(2 <= k <= 3 for k in keep)  # the forced tokens stay; unlikely lookup spans cost more than they give
    assert free_lengths(pol, [forced + lookup] * 8, [True] * 8) == [7] * 8  # seeded rows keep theirs
    cheap = AdaptivePolicy(SpecConfig(), ALL)  # nothing measured: the prior slope (7% a row) ...
    assert free_lengths(cheap, [[0.9] * 4], [False]) == [4]  # ... keeps likely candidates


def _cheap_draft_on_prose(read_per_token):
    """The cheap draft of test_a_draft_that_promises_too_little_is_not_tried (tried on a warm cache), reading a
    context token in `read_per_token` seconds."""
    from specstruct.spec.policy import ARM_TOKENS

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_cost("draft-timed", 1, 0.007)
    pol.observe_cost("draft-read-timed", 32, 32 * read_per_token)
    for rows in range(1, 10):
        pol.observe_cost("target", rows, 0.040 + 0.001 * (rows - 1))
    _free_arm(pol, "text", ARM_TOKENS, 1.05, 0.040)
    return pol


def test_the_trial_charges_the_drafts_cold_read():
    """A draft that would pay on a warm cache is not tried where reading the row's context first costs more than
    the trial's ARM_TOKENS tokens would win back: (t0 + d) / (P0 + k * e + R * (t0 + d) / ARM_TOKENS)."""
    from specstruct.spec.policy import ARM_TOKENS, TRIAL_GAIN

    pol = _cheap_draft_on_prose(0.002)
    warm = pol.trial_gain("text")
    assert warm > TRIAL_GAIN and pol.model_verdict("text", unread=0) == "explore-with"
    assert pol.model_verdict("text", unread=1000) == "off"
    assert "model" not in pol.plan("text", unread=1000).drafters and "model" in pol.plan("text", unread=2).drafters
    e = 0.007 + 0.040 * (pol.verify_ratio(9) - 1.0) / 8
    want = max((1.05 + expected_tokens(0.7, k) - 1) / (0.040 + k * e + 0.2 * (1.05 + expected_tokens(0.7, k) - 1)
                                                       / ARM_TOKENS) for k in (1, 2)) / (1.05 / 0.040)
    assert abs(pol.trial_gain("text", unread=100) - want) < 1e-9 and pol.trial_gain("text", unread=100) < warm
    unmeasured = AdaptivePolicy(SpecConfig(), ALL)  # no read timed: PRIOR_READ of a draft step
    unmeasured.observe_cost("draft-timed", 1, 0.007)
    from specstruct.spec.policy import PRIOR_READ

    assert unmeasured.read_cost() == PRIOR_READ * 0.007


def test_a_probe_of_the_draft_waits_for_a_warm_draft_cache():
    """Once both arms measured the draft slower, a probe reruns it now and then, but only at a step where the row's
    draft has nothing to read: one draft step cannot repay reading a whole context."""
    from specstruct.spec.policy import ARM_TOKENS, PROBE_ARM_EVERY, PROBE_COLD_EVERY

    pol = AdaptivePolicy(SpecConfig(), ALL)
    pol.observe_step("json", False, ARM_TOKENS, 1.0)
    pol.observe_step("json", True, ARM_TOKENS, 2.0)
    assert pol.model_verdict("json") == "off"
    cold = [pol.plan("json", unread=300) for _ in range(3 * PROBE_ARM_EVERY)]
    assert not any("model" in p.drafters for p in cold)
    assert "model" in pol.plan("json", unread=1).drafters  # due since long: the first warm step probes
    assert "model" not in pol.plan("json", unread=1).drafters
    # rows that always start cold still probe, at the longest every PROBE_COLD_EVERY steps
    cold = [pol.plan("json", unread=300) for _ in range(PROBE_COLD_EVERY)]
    assert sum("model" in p.drafters for p in cold) == 1


def test_a_rows_own_misses_stop_its_copies_while_the_modes_rows_keep_theirs():
    """An agent's free-text turn shares the grammar mode with tool-call turns whose copies land: its own misses,
    not the mode's rate, size its copies (RowRates); other rows still copy at the mode's rate."""
    pol, cap = AdaptivePolicy(SpecConfig(), ALL), SpecConfig().cap("grammar")
    for _ in range(20):  # the tool-call turns: the first token lands most of the time, the copy after it too
        pol.observe("grammar", "lookup", 6, 5)
    full = pol.plan("grammar").limits["lookup"]
    assert full == pol.lookup_k("grammar", cap, "lookup") > 1
    free = RowRates()
    misses = 0
    while pol.plan("grammar", own=free).limits["lookup"] > 0:
        free.observe(pol, "grammar", "lookup", 0)  # the free text's guess: rejected at its first token (the row's
        pol.observe("grammar", "lookup", 1, 0)  # rate first, as Row._record does)
        misses += 1
    assert misses <= 4
    assert pol.plan("grammar", own=RowRates()).limits["lookup"] > 1  # a new row starts from the mode's rate
    assert free.first["lookup"] < 0.1 < pol.lookup_rates("grammar", "lookup")[0]
    free.observe(pol, "grammar", "model", 0)  # not a copying proposer: no row rate
    assert "model" not in free.first


def test_a_row_probes_the_copies_its_own_rate_switched_off_whatever_the_batch_does():
    """A row whose copies its own misses switched off plans a one-token probe every PROBE_EVERY of its own steps,
    even while every batched pass resets the mode's probe count (another row's copies judged), and a probe that
    lands puts its copies back."""
    pol = AdaptivePolicy(SpecConfig(), ALL)
    for _ in range(20):
        pol.observe("grammar", "lookup", 6, 5)
    free = RowRates()
    for _ in range(6):
        free.observe(pol, "grammar", "lookup", 0)
    limits = []
    for _ in range(3 * PROBE_EVERY):
        limits.append(pol.plan("grammar", own=free).limits["lookup"])
        pol.idle_steps[("grammar", "lookup")] = 0  # a batched pass in which another row's copy was judged
    assert limits.count(1) == 3 and limits.count(0) == 3 * PROBE_EVERY - 3
    free.observe(pol, "grammar", "lookup", 1)  # the probe landed
    assert pol.plan("grammar", own=free).limits["lookup"] > 1


def test_in_a_batch_a_rows_copies_are_trimmed_by_its_own_rate():
    """Trimming a batched pass values a row's copies as `plan` sized them: at the row's own first-token rate. A
    free-text row whose copies keep missing loses them; a row of the same mode whose copies land keeps its own."""
    from specstruct.spec.batch_policy import free_lengths

    pol = AdaptivePolicy(SpecConfig(), ALL)
    for _ in range(20):
        pol.observe("grammar", "lookup", 6, 5)
    pol.target_cost = {1: 1.0, 8: 1.3, 32: 2.5}  # seconds of a target pass by rows: rows cost once a pass is full
    missing = RowRates()
    for _ in range(6):
        missing.observe(pol, "grammar", "lookup", 0)
    segments = [("lookup", 6)]
    mode_chain = pol.candidate_rates("grammar", segments, 0.7)
    own_chain = pol.candidate_rates("grammar", segments, 0.7, own=missing)
    assert own_chain[0] == missing.first["lookup"] < 0.1 < mode_chain[0] and own_chain[1:] == mode_chain[1:]
    assert pol.candidate_rates("grammar", segments, 0.7, own=RowRates()) == mode_chain  # no verdict of its own yet
    kept = free_lengths(pol, [own_chain, mode_chain, mode_chain, mode_chain], [False] * 4)
    assert kept[0] == 0 and min(kept[1:]) > 1
    # its probe (one token every PROBE_EVERY of its steps) is valued at the mode's rate, so the batch keeps it and the
    # row's rate can recover
    plans = [pol.plan("grammar", own=missing).limits["lookup"] for _ in range(PROBE_EVERY)]
    assert plans[-1] == 1 and "lookup" in missing.probing
    probe_chain = pol.candidate_rates("grammar", [("lookup", 1)], 0.7, own=missing)
    assert probe_chain == mode_chain[:1]
    assert free_lengths(pol, [probe_chain, mode_chain, mode_chain, mode_chain], [False] * 4)[0] == 1
    pol.plan("grammar", own=missing)  # the step after the probe plans no copy: no longer a probe
    assert "lookup" not in missing.probing
