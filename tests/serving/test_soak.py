"""`specstruct bench soak` against an in-process server: a few seconds of concurrent streams, hang-ups and hostile
requests give a report with every kind counted, no 5xx, 4xx for the hostile ones and RSS sampled."""

from __future__ import annotations

import asyncio
import os

from server_fixtures import KEY, MODEL, running, tiny_engine

from specstruct.bench.serve_load import Job
from specstruct.bench.soak import hostile_bodies, soak, table, verdict
from specstruct.serving.openai import create_app


def test_a_short_soak_counts_every_kind_and_finds_the_server_healthy():
    jobs = [Job({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                 "structured_outputs": {"regex": "[a-c]{4}"}}, lambda t: (len(t) == 4, ""))]
    kinds = ("bad-regex", "surrogate-property", "huge-int-seed", "nan-temperature")
    hostile = {k: v for k, v in hostile_bodies(MODEL).items() if k in kinds}
    with running(create_app(tiny_engine(), served_model_name=MODEL, api_key=KEY)) as base:
        result = asyncio.run(soak(base, jobs, seconds=3.0, streams=4, api_key=KEY, hostile=hostile,
                                  hostile_share=0.3, hangup_share=0.2, server_pid=os.getpid(),
                                  sample_every_s=0.5, deadline_s=30.0))
    kinds = result["kinds"]
    assert set(kinds) == {"normal", "hang-up", *(f"hostile:{k}" for k in hostile)}
    assert kinds["normal"]["sent"] > 0 and kinds["normal"]["status"].get("200", 0) == kinds["normal"]["sent"]
    for name in (f"hostile:{k}" for k in hostile):
        assert kinds[name]["sent"] > 0 and set(kinds[name]["status"]) == {"400"}, kinds[name]
    assert result["health"]["samples"] >= 3 and result["health"]["failed"] == 0
    assert result["rss"]["start_mb"] > 0 and result["timeline"][-1]["after"]
    problems = [p for p in verdict(result, deadline_s=30.0) if not p.startswith("RSS")]  # in-process RSS: the tests'
    assert problems == []
    assert "| normal |" in table(result) and "/health:" in table(result)


def test_every_hostile_body_is_a_request_a_client_can_send():
    import json

    from specstruct.bench.soak import Raw

    bodies = hostile_bodies(MODEL)
    assert {"grammar-loop", "backtracking-pattern", "many-stops", "many-tools", "header-flood", "huge-int-seed",
            "nan-temperature", "slow-grammar-compile"} <= set(bodies)
    assert all(json.loads(json.dumps(b))["model"] == MODEL for b in bodies.values() if isinstance(b, dict))
    for name, raw in bodies.items():
        if isinstance(raw, Raw):  # bodies a client can write, though Python's json cannot read them all
            assert raw.body.startswith(b'{"model": "tiny"') and b'"@"' not in raw.body, name
    assert b"9" * 5000 in bodies["huge-int-seed"].body and bodies["header-flood"].header_bytes >= 128 << 20


def test_the_help_names_every_hostile_kind():
    import inspect

    from specstruct.bench.soak_cli import soak as command

    help_text = inspect.signature(command).parameters["hostile"].default.help
    assert [k for k in hostile_bodies(MODEL) if k not in help_text] == []
