"""Per-scenario summaries of per-prompt records: medians over prompts, with the spread.

Speedups are computed per prompt (specstruct tokens/s over the other side's tokens/s on the same
prompt) and then summarised by their median, so one long prompt cannot dominate. Acceptance rate is
pooled (all accepted / all drafted candidates in the scenario); its per-prompt spread is given too.
"""

from __future__ import annotations

import statistics
from typing import Any

SPEC, TARGET_ONLY = "specstruct", "target-only"
EXTERNAL = ("outlines", "hf", "hf-assisted", "llama.cpp")
# A published multi-GPU result (4x A100) the issue asks to report against: (speedup, acceptance rate).
PUBLISHED = {"json": (3.8, 0.891), "code": (3.0, 0.623), "prose": (1.8, 0.176)}
# The candidates per step the same result names: 5-8 on JSON, 1-2 on prose where acceptance is low (none for code).
PUBLISHED_CANDIDATES = {"json": (5, 8), "prose": (1, 2)}


def spread(values: list[float]) -> dict[str, float] | None:
    """Median, quartiles and range of `values` (None when empty)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    if len(vals) == 1:
        q1 = q3 = vals[0]
    else:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    return {"median": statistics.median(vals), "p25": q1, "p75": q3, "min": vals[0], "max": vals[-1], "n": len(vals)}


def _median(values: list[float]) -> float | None:
    s = spread(values)
    return s["median"] if s else None


def _count(records: list[dict[str, Any]], key: str, side: str | None = None) -> dict[str, Any]:
    """{"ok", "total", "rate", "failures"} over records whose value for `key` (per side) is not None."""
    ok, total, failures = 0, 0, []
    for r in records:
        value = r[key].get(side) if side else r[key]
        if value is None:
            continue
        total += 1
        ok += bool(value)
        if not value:
            failures.append(r["id"])
    return {"ok": ok, "total": total, "rate": ok / total if total else None, "failures": failures}


def _pooled_drafters(spec_runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pooled: dict[str, dict[str, Any]] = {}
    for m in spec_runs:
        for name, d in (m.get("per_drafter") or {}).items():
            p = pooled.setdefault(name, {"proposed": 0, "accepted": 0})
            p["proposed"] += int(d.get("proposed", 0))
            p["accepted"] += int(d.get("accepted", 0))
    for p in pooled.values():
        p["acceptance_rate"] = p["accepted"] / p["proposed"] if p["proposed"] else None
    return pooled


def _steps(m: dict[str, Any]) -> int:
    return sum(int(v) for v in (m.get("k_histogram") or {}).values())


def _candidates(m: dict[str, Any]) -> float | None:
    """Candidates verified per decode step in one run (None where it reports no steps)."""
    steps = _steps(m)
    return (m.get("drafted") or 0) / steps if steps else None


def _prefill(m: dict[str, Any]) -> float | None:
    return (m.get("times") or {}).get("prefill_s")


def _decode_tps(m: dict[str, Any]) -> float | None:
    """Tokens per second after the prefill: the side's own figure (llama.cpp's timings), else new tokens over the
    wall clock less the prefill, where the side reports its prefill."""
    times = m.get("times") or {}
    if times.get("decode_tokens_per_s") is not None:
        return times["decode_tokens_per_s"]
    prefill, decode = times.get("prefill_s"), m.get("elapsed_s", 0.0) - (times.get("prefill_s") or 0.0)
    return m["new_tokens"] / decode if prefill is not None and decode > 0 and m.get("new_tokens") else None


def summarize_scenario(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one scenario's records (see docs/benchmarks.md for every key)."""
    done = [r for r in records if r["status"] == "ok"]
    sides = sorted({s for r in done for s in r["sides"]})
    spec = [r["sides"][SPEC] for r in done]
    drafted = sum(m.get("drafted") or 0 for m in spec)
    accepted = sum(m.get("accepted") or 0 for m in spec)
    tps = {s: spread([r["sides"][s]["tokens_per_s"] for r in done if s in r["sides"]]) for s in sides}
    ratios = {s: spread([r["speedup"][s] for r in done if r["speedup"].get(s) is not None]) for s in sides if s != SPEC}
    summary: dict[str, Any] = {
        "prompts": len(done),
        "skipped": len(records) - len(done),
        "skipped_ids": {r["id"]: r.get("reason", "") for r in records if r["status"] != "ok"},
        "baseline": TARGET_ONLY,
        "baseline_tokens_per_s": (tps.get(TARGET_ONLY) or {}).get("median"),
        "specstruct_tokens_per_s": (tps.get(SPEC) or {}).get("median"),
        "speedup": (ratios.get(TARGET_ONLY) or {}).get("median"),
        "speedup_spread": ratios.get(TARGET_ONLY),
        "decode_speedup": _median([r.get("decode_speedup") for r in done]),
        "speedup_vs": {s: ratios[s]["median"] for s in EXTERNAL if ratios.get(s)},
        "speedup_vs_spread": {s: ratios[s] for s in EXTERNAL if ratios.get(s)},
        "tokens_per_s": tps,
        "new_tokens": {s: _median([r["sides"][s]["new_tokens"] for r in done if s in r["sides"]]) for s in sides},
        "elapsed_s": {s: _median([r["sides"][s].get("elapsed_s") for r in done if s in r["sides"]]) for s in sides},
        "prefill_s": {s: _median([_prefill(r["sides"][s]) for r in done if s in r["sides"]]) for s in sides},
        "decode_tokens_per_s": {s: _median([_decode_tps(r["sides"][s]) for r in done if s in r["sides"]])
                                for s in sides},
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_rate_spread": spread([m.get("acceptance_rate") for m in spec]),
        "drafted": drafted,
        "accepted": accepted,
        "candidates_per_step": drafted / steps if (steps := sum(_steps(m) for m in spec)) else None,
        "candidates_per_step_spread": spread([_candidates(m) for m in spec]),
        "tokens_per_forward": _median([m.get("tokens_per_forward") for m in spec]),
        "per_drafter": _pooled_drafters(spec),
        "valid": _count(done, "valid", SPEC),
        "truncated": sorted(r["id"] for r in done if r["sides"][SPEC].get("finish_reason") == "length"),
        "valid_by_side": {s: _count(done, "valid", s) for s in sides},
        "identical": _count(done, "identical"),
    }
    if any(r.get("passed") for r in done):
        summary["pass_at_1"] = {s: _count(done, "passed", s)["rate"] for s in sides}
    if records and records[0]["scenario"] in PUBLISHED:
        speed, rate = PUBLISHED[records[0]["scenario"]]
        summary["published_reference"] = {"speedup": speed, "acceptance_rate": rate, "setting": "4x A100, multi-GPU",
                                          "candidates_per_step": PUBLISHED_CANDIDATES.get(records[0]["scenario"])}
    return summary


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`scenarios.<name>` for every scenario present, in first-seen order."""
    order = list(dict.fromkeys(r["scenario"] for r in records))
    return {name: summarize_scenario([r for r in records if r["scenario"] == name]) for name in order}
