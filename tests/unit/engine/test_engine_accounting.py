"""The decode loop's bookkeeping: a request's config never overwrites the engine's shared
policy config, and per-drafter stats count only tokens the target judged."""

from __future__ import annotations

import specstruct as ss
from specstruct.spec.row import Row
from specstruct.testing import run_alone, scripted_engine


def test_a_request_config_does_not_overwrite_the_shared_policy_config():
    engine = scripted_engine('{"a": 1}')
    shared = engine.speculator.policy
    other = ss.SpecConfig(max_candidates={"json": 1}, initial_candidates=1)
    decode = engine.speculator.row(engine.prompt_ids("go"), engine.constraint({"type": "object"}), other)
    run_alone(decode)
    assert shared.config is engine.config  # what a call without its own config plans with
    plan = shared.plan("json")  # the request's caps (1) were its own, not the engine's
    assert plan.k == engine.config.cap("json") == 8 and plan.limits["forced"] == 8
    assert decode._plan().k == 1  # ... while the request itself plans with its own config


def test_per_drafter_stats_count_only_judged_tokens():
    engine = scripted_engine("abc")
    decode = Row(engine.speculator, [1, 2], engine.constraint(None), engine.config)
    # forced proposed 2, lookup 3, model 4; the target accepted 3: both forced tokens and lookup's first, then
    # rejected lookup's second. Lookup's third and all of the model's tokens were never judged.
    seen = []
    decode.policy.observe = lambda mode, name, proposed, accepted, config: seen.append((name, proposed, accepted))
    decode._record([("forced", 2), ("lookup", 3), ("model", 4)], accepted=3)
    # the policy learns per-token rates from judged tokens only: lookup's rejected second token ends its trials
    assert seen == [("forced", 2, 2), ("lookup", 2, 1)]
    per = decode.stats.per_drafter
    assert (per["forced"].proposed, per["forced"].accepted) == (2, 2)
    assert (per["lookup"].proposed, per["lookup"].accepted) == (2, 1)
    assert "model" not in per or per["model"].proposed == 0
