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
