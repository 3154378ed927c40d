"""JSON-schema conformance on JSONSchemaBench: does every schema compile or refuse cleanly, and does the
automaton accept the valid instances (and reject the invalid ones)?

    python -m specstruct.bench.conformance [--limit N] [--tokenizer tiny|qwen] [--backend llguidance,outlines,tools]
                                           [--compile-limit 20] [--out report.json]

For each schema: compile it with the tokenizer (tiny: the 400-token byte-level test BPE; qwen: Qwen2.5's
151,936-row vocabulary) through a JSON backend (llguidance: the default; outlines: outlines_core regexes;
xgrammar: for comparison, if installed; tools: the schema as a tool's parameters, walked inside the tool-call
grammar of the server and langchain-specstruct). A schema must either compile or raise ConstraintError (which the
compile limits raise for a too complex schema); anything else is a crash, and a worker that outlives
`--compile-limit` plus a grace period is killed and counted as `killed` (a limit that failed to hold).
For compiled schemas each `valid: true` instance, serialised as the engine writes JSON (`json.dumps`,
properties in schema order), must be accepted token by token; `valid: false` instances the automaton accepts
are counted as over-permissive. Per schema: compile time and peak memory; per token: mask time.

The schemas: the *.json files of $SPECSTRUCT_JSONSCHEMABENCH (the full corpus: the 5,549 files of
guidance-ai/jsonschemabench's maskbench/data), else the 208-file subset in tests/data/jsonschemabench.
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

from specstruct.constraints.schema.normalise import follow_ref
from specstruct.bench.conformance_reasons import reason
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


def _record(name: str, status: str = "compiled", error: str | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "error": error, "valid": 0, "valid_accepted": 0, "invalid": 0,
            "invalid_rejected": 0, "rejected_valid": [], "over_permissive": [], "mask_s": []}


def check_one(path: str, tok=None, backend: str = "llguidance") -> dict:
    """Compile one corpus schema and walk its instances. Never raises: crashes are recorded.
    `tok` is (tokenizer, vocab_size, eos_ids); default the tiny tokenizer."""
    from specstruct.bench.conformance_backends import compile_schema, load_tokenizer, peak_begin, peak_end, walk
    from specstruct.errors import ConstraintError

    tokenizer, vocab_size, eos = tok or load_tokenizer("tiny")
    doc = json.loads(Path(path).read_text())
    schema, tests = doc["schema"], doc.get("tests", [])
    rec = _record(Path(path).stem)
    base, start = peak_begin(), time.perf_counter()
    try:
        constraint = compile_schema(backend, schema, tokenizer, vocab_size, eos)
    except ConstraintError as e:
        rec.update(status="unsupported", error=str(e).splitlines()[0][:300])
        return rec
    except Exception as e:  # noqa: BLE001 - anything but ConstraintError is a bug we must see
        rec.update(status="crash", error=f"{type(e).__name__}: {e}"[:300])
        return rec
    rec["compile_s"], rec["peak_mb"] = round(time.perf_counter() - start, 4), peak_end(base)
    for test in tests:
        text = serialise(test["data"], schema)
        times = rec["mask_s"] if len(rec["mask_s"]) < 400 else None
        encode = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        try:
            ok = walk(constraint, encode(text), times) or walk(
                constraint, encode(json.dumps(test["data"], ensure_ascii=False)), None)
        except Exception as e:  # noqa: BLE001 - a failure while walking is a crash too
            rec.update(status="crash", error=f"walking: {type(e).__name__}: {e}"[:300])
            return rec
        if test.get("valid"):
            rec["valid"] += 1
            rec["valid_accepted"] += ok
            if not ok:
                rec["rejected_valid"].append({"text": text[:300],
                                              "reason": reason(test["data"], schema, text, backend)})
        else:
            rec["invalid"] += 1
            rec["invalid_rejected"] += not ok
            if ok:
                rec["over_permissive"].append(text[:300])
    return rec


def _worker(conn, tokenizer: str, backend: str, compile_limit: float) -> None:
    from specstruct.bench.conformance_backends import compile_schema, load_tokenizer
    from specstruct.constraints.limits import set_limits

    set_limits(time_s=compile_limit)
    tok = load_tokenizer(tokenizer)
    compile_schema(backend, {"type": "object", "properties": {"a": {"type": "integer"}}}, *tok)  # warm: token tables
    conn.send("ready")
    while True:
        path = conn.recv()
        if path is None:
            return
        conn.send(check_one(path, tok, backend))


def run(files: Iterable[Path], compile_limit: float = 20.0, progress: bool = True, tokenizer: str = "tiny",
        backend: str = "llguidance", grace: float = 60.0) -> list[dict]:
    """check_one over `files` in a worker process; one that outlives `compile_limit + grace` is killed."""
    from tqdm import tqdm

    ctx = mp.get_context("fork")
    records: list[dict] = []
    proc = conn = None
    for path in tqdm(list(files), desc=f"{backend}/{tokenizer}", disable=not progress, unit="schema"):
        if proc is None:
            conn, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, tokenizer, backend, compile_limit), daemon=True)
            proc.start()
            conn.recv()
        conn.send(str(path))
        if conn.poll(compile_limit + grace):
            records.append(conn.recv())
            continue
        proc.kill()
        proc.join()
        proc = None
        records.append(_record(path.stem, "killed", f"no answer within {compile_limit + grace:g} s"))
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
    from specstruct.bench.conformance_backends import percentiles

    pct = lambda a, b: round(100.0 * a / b, 2) if b else None  # noqa: E731
    return {
        "schemas": n, "compiled": by["compiled"], "compiled_pct": pct(by["compiled"], n),
        "unsupported": sum(1 for r in records if r["status"] == "unsupported" and "too complex" not in r["error"]),
        "too_complex": sum(1 for r in records if r["status"] == "unsupported" and "too complex" in r["error"]),
        "crashes": by["crash"], "killed": by["killed"],
        "compile_s": percentiles([r["compile_s"] for r in compiled]),
        "peak_mb": percentiles([r["peak_mb"] for r in compiled], digits=1),
        "mask_us": percentiles([t for r in compiled for t in r["mask_s"]], 1e6, 1),
        "masks_over_1ms": _slow_masks(compiled),
        "valid_instances": valid, "valid_accepted_pct": pct(sum(r["valid_accepted"] for r in compiled), valid),
        "invalid_instances": invalid,
        "invalid_rejected_pct": pct(sum(r["invalid_rejected"] for r in compiled), invalid),
        "top_unsupported": keywords.most_common(15), "valid_rejected_reasons": reasons.most_common(),
    }


def _slow_masks(compiled: list[dict], limit_s: float = 1e-3) -> dict:
    """How many timed masks took over 1 ms (the p99 goal), and the schemas with the most of them."""
    masks = sum(len(r["mask_s"]) for r in compiled)
    per = collections.Counter({r["name"]: sum(t > limit_s for t in r["mask_s"]) for r in compiled})
    over = sum(per.values())
    return {"over": over, "of": masks, "pct": round(100.0 * over / masks, 3) if masks else None,
            "most_in": [(name, k) for name, k in per.most_common(5) if k]}


def table(summaries: dict[str, dict]) -> str:
    """The side-by-side markdown table of `{backend: summary}`."""
    rows = [("schemas", "schemas"), ("compiled %", "compiled_pct"), ("refused (unsupported)", "unsupported"),
            ("refused (too complex)", "too_complex"), ("crashes", "crashes"), ("killed (limit failed)", "killed"),
            ("valid accepted %", "valid_accepted_pct"), ("invalid rejected %", "invalid_rejected_pct"),
            ("compile s p50 / p99 / max", "compile_s"), ("peak MB p50 / p99 / max", "peak_mb"),
            ("mask us/token p50 / p99 / max", "mask_us"), ("masks over 1 ms: count / of / %", "masks_over_1ms")]
    cell = lambda v: " / ".join(str(x) for x in v.values() if not isinstance(x, list)) if isinstance(v, dict) \
        else str(v)  # noqa: E731
    out = ["| figure | " + " | ".join(summaries) + " |", "|---" * (len(summaries) + 1) + "|"]
    out += [f"| {label} | " + " | ".join(cell(s[key]) for s in summaries.values()) + " |" for label, key in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specstruct.bench.conformance", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--limit", type=int, default=None, help="check a deterministic sample of N schemas")
    ap.add_argument("--seed", type=int, default=0, help="sample seed (with --limit)")
    ap.add_argument("--tokenizer", choices=["tiny", "qwen"], default="tiny",
                    help="tiny: the 400-token test BPE; qwen: Qwen2.5-Coder's tokenizer (must be pulled)")
    ap.add_argument("--backend", default="llguidance",
                    help="comma-separated JSON backends to compare side by side: llguidance,outlines,xgrammar; "
                         "tools: each schema as a tool's parameters in the tool-call grammar")
    ap.add_argument("--compile-limit", type=float, default=20.0,
                    help="specstruct's compile time limit (CompileLimits.time_s) in seconds")
    ap.add_argument("--out", type=Path, default=None, help="write the summaries and every record as JSON here")
    args = ap.parse_args(argv)
    if corpus_dir() is None:
        print("JSONSchemaBench not found: set SPECSTRUCT_JSONSCHEMABENCH to a folder of its *.json files "
              "(default: the 208-schema subset in tests/data/jsonschemabench of a checkout of the repository).")
        return 2
    files = corpus_files(args.limit, args.seed)
    results = {}
    for backend in args.backend.split(","):
        records = run(files, args.compile_limit, tokenizer=args.tokenizer, backend=backend)
        results[backend] = {"summary": summarise(records), "records": records}
        print(json.dumps({backend: results[backend]["summary"]}, indent=1, ensure_ascii=False))
    print(f"\n{len(files)} schemas, tokenizer {args.tokenizer}:\n" + table({b: r["summary"] for b, r in results.items()}))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    return 1 if any(r["summary"]["crashes"] or r["summary"]["killed"] for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
