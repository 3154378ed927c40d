"""Bulk extraction on a local Ray cluster: rows in order, values that validate, bad rows recorded, not fatal.
One actor pool for the module: Ray starts a fresh Python (torch import, engine load) per actor."""

from __future__ import annotations

import json

import jsonschema
import pytest

import specstruct.serving.ray as ssr

pytest.importorskip("ray.data", reason='ray[data] is not installed: pip install -e ".[ray]" to run the Ray tests')

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                           "maximum": 9}},
          "required": ["ok", "n"]}
BAD_NULL, BAD_LONG = 7, 31  # a row with no text; a row far longer than the tiny model's 4096-token window
BAD = {BAD_NULL: "BadInputError", BAD_LONG: "PromptTooLongError"}


@pytest.fixture(scope="module")
def extracted(ray_cluster, tiny_folders):
    items = [{"id": i, "text": f"Row {i}: the flag is {'on' if i % 2 else 'off'}."} for i in range(50)]
    items[BAD_NULL]["text"] = None
    items[BAD_LONG]["text"] = "word " * 6000
    ds = ray_cluster.data.from_items(items, override_num_blocks=5)
    target, draft = tiny_folders
    out = ssr.extract(ds, SCHEMA, model=target, draft=draft, prompt="Extract the flag.\n{text}", actors=1,
                      batch_size=10)
    return out.materialize()  # run once; both tests read the same blocks


def test_extract_returns_every_row_in_order_with_errors_recorded(extracted):
    out = extracted.take_all()
    assert [r["id"] for r in out] == list(range(50))
    assert set(ssr.RESULT_COLUMNS) <= set(out[0])
    for r in out:
        if r["id"] in BAD:
            assert r["error_type"] == BAD[r["id"]] and r["value"] is None and r["error"], r
            continue
        assert r["error"] is None, r["error"]
        value = json.loads(r["value"])
        jsonschema.validate(value, SCHEMA)
        assert json.loads(r["raw_text"]) == value and r["finish_reason"] == "stop"
        assert r["new_tokens"] > 0 and 0 < r["target_forwards"] <= r["new_tokens"] + 1 and r["attempts"] == 1


def test_jsonl_output_has_one_line_per_row_with_values_as_objects(extracted, tmp_path):
    """What `specstruct extract --ray --output` writes."""
    from specstruct.serving.ray.jobs import write_jsonl

    dst = tmp_path / "out.jsonl"
    assert write_jsonl(extracted, str(dst), total=50, progress=False) == {"rows": 50, "errors": 2}
    lines = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [line["id"] for line in lines] == list(range(50))
    jsonschema.validate(lines[0]["value"], SCHEMA)
    assert isinstance(lines[0]["new_tokens"], int) and lines[BAD_NULL]["value"] is None


def test_extract_refuses_a_prompt_without_the_text_placeholder(ray_cluster, tiny_folders):
    with pytest.raises(ValueError, match="placeholder"):
        ssr.extract(ray_cluster.data.from_items([{"text": "x"}]), SCHEMA, model=tiny_folders[0], prompt="Extract.")


@pytest.mark.parametrize("args, message", [
    (["--ray", "--output", "o.jsonl"], "--ray needs --input"),
    (["--ray", "--input", "missing.jsonl", "--output", "o.jsonl"], "not found"),
    (["--ray", "--text", "-", "--input", "x", "--output", "o"], "--text reads one document"),
])
def test_cli_ray_usage_errors_exit_2(tmp_path, args, message):
    from typer.testing import CliRunner

    from specstruct.cli import app

    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    res = CliRunner().invoke(app, ["extract", "--schema", str(tmp_path / "s.json"), *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_cli_ray_input_output_and_model_are_checked_before_ray_starts(tmp_path, monkeypatch, tiny_folders):
    """Found by probing: these failed inside Ray (exit 1, a cut-off Ray traceback; the model error only in Ray's
    logs), and a failed job emptied an existing --output file."""
    from typer.testing import CliRunner

    from specstruct.cli import app

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "nocol.jsonl").write_text('{"body": "a"}\n')
    (tmp_path / "notjson.jsonl").write_text("not json\n")
    (tmp_path / "good.jsonl").write_text('{"text": "a"}\n')
    base = ["extract", "--schema", str(tmp_path / "s.json"), "--ray", "--no-draft", "--output"]
    cases = [([str(tmp_path / "o.jsonl"), "--input", str(tmp_path / "nocol.jsonl"), "-m", tiny_folders[0]], 2,
              "with a 'text' field"),
             ([str(tmp_path / "o.jsonl"), "--input", str(tmp_path / "notjson.jsonl"), "-m", tiny_folders[0]], 2,
              "not JSON lines"),
             ([str(tmp_path / "nodir" / "o.jsonl"), "--input", str(tmp_path / "good.jsonl")], 2, "folder does not exist"),
             ([str(tmp_path / "o.jsonl"), "--input", str(tmp_path / "good.jsonl"), "-m", "no-such-model-xyz"], 4,
              "cannot find model")]
    for args, code, message in cases:
        res = CliRunner().invoke(app, base + args)
        assert res.exit_code == code and message in res.output, (args, res.output)


def test_result_blocks_have_one_arrow_schema(extracted, tmp_path):
    """Found by probing: a block with no error wrote `error` as Arrow null (and value/attempts likewise in failed
    blocks), so the job's parquet files could not be read back as one table."""
    import pyarrow.parquet as pq

    extracted.write_parquet(str(tmp_path))
    table = pq.read_table(str(tmp_path))
    assert table.num_rows == 50
    assert {table.schema.field(c).type.id for c in ("value", "error", "raw_text")} == {table.schema.field("value").type.id}
    assert str(table.schema.field("attempts").type) == "int64"


def test_a_schema_that_cannot_compile_raises_before_any_actor_starts(ray_cluster, tiny_folders):
    from specstruct.errors import ConstraintError

    with pytest.raises(ConstraintError):
        ssr.extract(ray_cluster.data.from_items([{"text": "x"}]), {"type": "object", "properties": {
            "a": {"type": "frobnicate"}}}, model=tiny_folders[0])


def test_a_prompt_callable_that_fails_on_a_row_is_that_rows_error(ray_cluster, tiny_folders):
    def prompt(text):
        if "bad" in text:
            raise ValueError("no")
        return "Extract the flag.\n" + text

    rows = ssr.extract(ray_cluster.data.from_items([{"text": "fine"}, {"text": "bad row"}]), SCHEMA,
                       model=tiny_folders[0], prompt=prompt).take_all()
    assert rows[1]["error_type"] == "BadInputError" and "prompt= raised" in rows[1]["error"]
    assert rows[0]["error_type"] != "BadInputError"


def test_a_failed_job_leaves_an_existing_output_file_as_it_was(tmp_path):
    from specstruct.serving.ray.jobs import write_jsonl

    class Failing:
        def iter_rows(self):
            yield {"value": None, "error": None}
            raise RuntimeError("the job failed")

    out = tmp_path / "prev.jsonl"
    out.write_text('{"keep": 1}\n')
    with pytest.raises(RuntimeError):
        write_jsonl(Failing(), str(out), progress=False)
    assert out.read_text() == '{"keep": 1}\n' and not list(tmp_path.glob(".*partial"))
