"""JSON-schema conformance on JSONSchemaBench: does every schema compile or refuse cleanly, and does the
automaton accept the valid instances (and reject the invalid ones)?

    python -m specstruct.bench.conformance [--limit N] [--out report.json] [--timeout 20]

For each schema: compile it with the tiny byte-level BPE tokenizer (it has all 256 bytes, so any text is
writable). A schema must either compile or raise ConstraintError; anything else is a crash. For compiled
schemas each `valid: true` instance, serialised as the engine writes JSON (`json.dumps`, properties in
schema order), must be accepted token by token; `valid: false` instances the automaton accepts are
counted as over-permissive. Each schema runs in a worker process that is killed after `--timeout`
seconds (outlines_core can take very long on huge schemas): that counts as `too complex`.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import random
import re
import time
from pathlib import Path
from typing import Any, Iterable

from specstruct.constraints.schema_normalise import follow_ref
from specstruct.bench.workloads import jsonschemabench_dir

VOCAB_SIZE, EOS = 408, 2  # tiny_model's padded LM head; <|im_end|>


corpus_dir = jsonschemabench_dir  # the JSONSchemaBench folder, or None (one finder for the whole bench)


def corpus_files(limit: int | None = None, seed: int = 0) -> list[Path]:
    """All corpus files (sorted), or a deterministic random sample of `limit` of them."""
    root = corpus_dir()
    files = sorted(root.glob("*.json")) if root else []
    if limit is not None and limit < len(files):
        files = sorted(random.Random(seed).sample(files, limit))
    return files


def serialise(value: Any, schema: Any, root: Any | None = None) -> str:
    """`value` as the engine emits it: json.dumps form, object keys in the schema's property order."""
    return json.dumps(canonical(value, schema, root if root is not None else schema), ensure_ascii=False)


def canonical(value: Any, node: Any, root: Any, depth: int = 0) -> Any:
    node = follow_ref(node, root)
    if depth > 30 or not isinstance(node, dict):
        return value
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list) and node[key]:
            branch = _best_branch(value, node[key], root)
            value = canonical(value, {**{k: v for k, v in node.items() if k != key}, **follow_ref(branch, root)},
                              root, depth + 1) if isinstance(follow_ref(branch, root), dict) else value
    types = node.get("type")
    if types == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict) and isinstance(node.get("properties"), dict):
        props = node["properties"]
        ordered = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: canonical(value[k], props.get(k, node.get("additionalProperties")), root, depth + 1)
                for k in ordered}
    if isinstance(value, dict) and isinstance(node.get("additionalProperties"), dict):
        return {k: canonical(v, node["additionalProperties"], root, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        prefix = node.get("prefixItems") or (node["items"] if isinstance(node.get("items"), list) else [])
        rest = node.get("items") if isinstance(node.get("items"), dict) else None
        return [canonical(v, prefix[i] if i < len(prefix) else rest, root, depth + 1) for i, v in enumerate(value)]
    return value


def _best_branch(value: Any, branches: list, root: Any) -> Any:
    def score(b: Any) -> int:
        b = follow_ref(b, root)
        if isinstance(value, dict) and isinstance(b, dict) and isinstance(b.get("properties"), dict):
            return len(set(value) & set(b["properties"]))
        return 0
    return max(branches, key=score)


def check_one(path: str, tokenizer=None) -> dict:
    """Compile one corpus schema and walk its instances. Never raises: crashes are recorded."""
    from specstruct.constraints.compiler import compile_constraint
    from specstruct.errors import ConstraintError
    from specstruct.constraints.base import ConstraintSpec
    from specstruct.testing import tiny_tokenizer

    tokenizer = tokenizer or tiny_tokenizer()
    doc = json.loads(Path(path).read_text())
    schema, tests = doc["schema"], doc.get("tests", [])
    rec: dict[str, Any] = {"name": Path(path).stem, "status": "compiled", "error": None, "valid": 0,
                           "valid_accepted": 0, "invalid": 0, "invalid_rejected": 0, "rejected_valid": [],
                           "over_permissive": []}
    start = time.perf_counter()
    try:
        spec = ConstraintSpec("json", json.dumps(schema), "json")
        constraint = compile_constraint(spec, tokenizer, vocab_size=VOCAB_SIZE, eos_token_ids=[EOS])
    except ConstraintError as e:
        rec.update(status="unsupported", error=str(e).splitlines()[0][:300])
        return rec
    except Exception as e:  # noqa: BLE001 - anything but ConstraintError is a bug we must see
        rec.update(status="crash", error=f"{type(e).__name__}: {e}"[:300])
        return rec
    rec["compile_s"] = round(time.perf_counter() - start, 3)
    for test in tests:
        text = serialise(test["data"], schema)
        ok = constraint.accepts(text) or constraint.accepts(json.dumps(test["data"], ensure_ascii=False))
        if test.get("valid"):
            rec["valid"] += 1
            rec["valid_accepted"] += ok
            if not ok:
                rec["rejected_valid"].append({"text": text[:300], "reason": reason(test["data"], schema, text)})
        else:
            rec["invalid"] += 1
            rec["invalid_rejected"] += not ok
            if ok:
                rec["over_permissive"].append(text[:300])
    return rec


def reason(value: Any, schema: Any, text: str) -> str:
    """Best-effort label for why a valid instance is outside the automaton's language (see docs)."""
    declared = set(re.findall(r'"properties": \{"([^"]+)"', json.dumps(schema)))
    for node in _walk_schema(schema):
        if isinstance(node.get("properties"), dict):
            declared |= set(node["properties"])
    keys = set(_keys(value))
    if re.search(r"\\u[0-9a-fA-F]{4}", text):
        return "control character (needs a \\u escape outlines_core's string regex lacks)"
    if "\\" in text and any({"minLength", "maxLength"} & set(node) for node in _walk_schema(schema)):
        return "escape in a length-bounded string (generated without escape sequences)"
    if any("pattern" in node for node in _walk_schema(schema)):
        return "pattern (JSON Schema searches, outlines_core matches the whole string)"
    if any(node.get("format") in ("uri", "email", "date-time", "time") for node in _walk_schema(schema)):
        return "format (outlines_core's format regexes are narrower than the RFCs, e.g. uri is http/ftp/urn)"
    if declared and keys - declared:
        return "undeclared property (only declared properties are generated)"
    if _depth(value) > 3:
        return "nesting depth (free-form JSON and $ref are unrolled to a fixed depth)"
    return "other"


def _walk_schema(node: Any):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk_schema(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_schema(v)


def _keys(value: Any):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _worker(conn) -> None:
    from specstruct.testing import tiny_tokenizer

    tok = tiny_tokenizer()
    while True:
        path = conn.recv()
        if path is None:
            return
        conn.send(check_one(path, tok))


def run(files: Iterable[Path], timeout: float = 20.0, progress: bool = True) -> list[dict]:
    """check_one over `files` in a worker process that is replaced when a schema exceeds `timeout`."""
    from tqdm import tqdm

    ctx = mp.get_context("fork")
    records: list[dict] = []
    proc = conn = None
    for path in tqdm(list(files), desc="schemas", disable=not progress, unit="schema"):
        if proc is None:
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
        conn.send(str(path))
        if conn.poll(timeout):
            records.append(conn.recv())
            continue
        proc.kill()
        proc.join()
        proc = None
        records.append({"name": path.stem, "status": "too_complex", "error": f"compile exceeded {timeout:g} s",
                        "valid": 0, "valid_accepted": 0, "invalid": 0, "invalid_rejected": 0,
                        "rejected_valid": [], "over_permissive": []})
    if proc is not None:
        conn.send(None)
        proc.join(5)
    return records


def summarise(records: list[dict]) -> dict:
    n = len(records)
    by = collections.Counter(r["status"] for r in records)
    compiled = [r for r in records if r["status"] == "compiled"]
    valid = sum(r["valid"] for r in compiled)
    invalid = sum(r["invalid"] for r in compiled)
    keywords = collections.Counter()
    for r in records:
        if r["status"] == "unsupported":
            m = re.search(r"keyword '([^']+)'", r["error"] or "")
            keywords[m.group(1) if m else (r["error"] or "")[:60]] += 1
    reasons = collections.Counter(x["reason"] for r in compiled for x in r["rejected_valid"])
    pct = lambda a, b: round(100.0 * a / b, 2) if b else None  # noqa: E731
    return {
        "schemas": n, "compiled": by["compiled"], "compiled_pct": pct(by["compiled"], n),
        "unsupported": by["unsupported"], "too_complex": by["too_complex"], "crashes": by["crash"],
        "valid_instances": valid, "valid_accepted_pct": pct(sum(r["valid_accepted"] for r in compiled), valid),
        "invalid_instances": invalid,
        "invalid_rejected_pct": pct(sum(r["invalid_rejected"] for r in compiled), invalid),
        "top_unsupported": keywords.most_common(15), "valid_rejected_reasons": reasons.most_common(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specstruct.bench.conformance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="check a deterministic sample of N schemas")
    ap.add_argument("--seed", type=int, default=0, help="sample seed (with --limit)")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per schema before it counts as too complex")
    ap.add_argument("--out", type=Path, default=None, help="write the summary and every record as JSON here")
    args = ap.parse_args(argv)
    if corpus_dir() is None:
        print("JSONSchemaBench not found: set SPECSTRUCT_JSONSCHEMABENCH to its folder "
              "(default ../shared/data/jsonschemabench from the repo root).")
        return 2
    records = run(corpus_files(args.limit, args.seed), timeout=args.timeout)
    summary = summarise(records)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "records": records}, indent=1, ensure_ascii=False))
    return 1 if summary["crashes"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
