"""`specstruct extract --ray` row by row: no row can hold the job hostage. A row past a per-row limit (input tokens,
seconds) or the model's window, or without its text field, comes back at once as an error row naming the limit and
its flag; every row is written (and counted by the progress bar) as it finishes, not when its batch does; the file
still ends up in input order."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

pytest.importorskip("ray.data", reason='ray[data] is not installed: pip install -e ".[ray]" to run the Ray tests')

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_short_rows_come_back_and_a_too_long_and_a_malformed_row_are_error_rows(ray_cluster, tiny_folders, tmp_path):
    """The bulk goal: 5 short rows + 1 past --max-input-tokens + 1 without a text field -> 7 rows, 5 values, 2 error
    rows, in input order, within a couple of minutes on 2 cores (before: every row waited for the slowest)."""
    from typer.testing import CliRunner

    from specstruct.cli import app

    rows = [{"id": i, "text": f"Row {i}: the flag is on."} for i in range(5)]
    rows.insert(3, {"id": "long", "text": "word " * 500})  # inside the tiny model's window, past the limit
    rows.insert(5, {"id": "malformed", "body": "no text field"})
    write_rows(tmp_path / "in.jsonl", rows)
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    started = time.monotonic()
    res = CliRunner().invoke(app, ["extract", "--ray", "--schema", str(tmp_path / "s.json"), "--input",
                                   str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"), "-m",
                                   tiny_folders[0], "--no-draft", "--max-new-tokens", "24",
                                   "--max-input-tokens", "400"])
    elapsed = time.monotonic() - started
    assert res.exit_code == 0, res.output
    assert "7 rows, 2 errors" in res.output
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == [r["id"] for r in rows]
    by_id = {r["id"]: r for r in out}
    assert by_id["long"]["value"] is None and by_id["long"]["error_type"] == "RowLimitError"
    assert "--max-input-tokens 400" in by_id["long"]["error"] and by_id["long"]["prompt_tokens"] > 400
    assert by_id["malformed"]["value"] is None and by_id["malformed"]["error_type"] == "BadInputError"
    assert "'text'" in by_id["malformed"]["error"]
    values = [r for r in out if r["value"] is not None]
    assert len(values) == 5
    for r in values:
        jsonschema.validate(r["value"], SCHEMA)
    assert elapsed < 180, elapsed


def test_rows_are_written_as_they_finish_and_a_slow_row_holds_no_other(ray_cluster, tiny_folders, tmp_path):
    """One row takes 40 s (a long document within every limit); the others are written, and counted, long before it
    is done. Before: rows came back per batch, so all of them waited for the slow one."""
    from specstruct.serving.ray.jobs import extract_jsonl

    target = tiny_folders[0]

    def slow_engine():
        import time as clock

        import specstruct as ss

        engine = ss.SpecStruct.from_pretrained(target, decoding_params={"max_new_tokens": 24})
        run = engine.run

        def maybe_slow(prompt, *args, **kwargs):
            if "slow" in str(prompt):
                clock.sleep(40)
            return run(prompt, *args, **kwargs)

        engine.run = maybe_slow
        return engine

    rows = [{"id": i, "text": "slow row" if i == 0 else f"Row {i}: on."} for i in range(6)]
    write_rows(tmp_path / "in.jsonl", rows)
    seen = []
    started = time.monotonic()
    summary = extract_jsonl(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), SCHEMA, model=slow_engine,
                            progress=False, on_row=lambda row: seen.append((row["id"], time.monotonic() - started)))
    assert summary == {"rows": 6, "errors": 0}
    assert [i for i, _ in seen][-1] == 0 and sorted(i for i, _ in seen) == list(range(6))
    slow_at = seen[-1][1]
    assert all(at < slow_at - 20 for _, at in seen[:-1]), seen
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["id"] for r in out] == list(range(6))  # the file is in input order all the same


def test_a_row_past_its_time_limit_is_an_error_row_naming_the_flag(ray_cluster, tiny_folders, tmp_path):
    from specstruct.serving.ray.jobs import extract_jsonl

    target = tiny_folders[0]

    def slow_steps_engine():
        import types

        import specstruct as ss
        from specstruct.testing import slow_steps

        slow_steps(types.SimpleNamespace(setattr=setattr), 1.0)  # every decode step takes a second in this actor
        return ss.SpecStruct.from_pretrained(target, decoding_params={"max_new_tokens": 40})

    write_rows(tmp_path / "in.jsonl", [{"text": "a"}, {"text": "b"}, "not json", {"text": ""}])
    started = time.monotonic()
    summary = extract_jsonl(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), SCHEMA,
                            model=slow_steps_engine, row_timeout=3, progress=False)
    assert summary == {"rows": 4, "errors": 4}
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["error_type"] for r in out] == ["RowLimitError", "RowLimitError", "BadInputError", "BadInputError"]
    assert "--row-timeout 3" in out[0]["error"] and out[0]["prompt_tokens"] > 0
    assert "not a JSON object" in out[2]["error"]
    assert time.monotonic() - started < 90


def test_the_dataset_api_applies_the_same_row_limits(ray_cluster, tiny_folders):
    import specstruct.serving.ray as ssr

    ds = ray_cluster.data.from_items([{"text": "Row: on."}, {"text": "word " * 500}])
    rows = ssr.extract(ds, SCHEMA, model=tiny_folders[0], config={"max_new_tokens": 24},
                       max_input_tokens=400).take_all()
    assert rows[0]["error"] is None and json.loads(rows[0]["value"]) in ({"ok": True}, {"ok": False})
    assert rows[1]["error_type"] == "RowLimitError" and "max_input_tokens=400" in rows[1]["error"]
