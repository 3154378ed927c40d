"""`python -m benchmarks.ablation`: which drafters, draft numerics and caps pay on JSON, and where a
decoding step's wall time goes.

Every variant runs on the same engine and weights in one process; the order of the variants rotates from prompt
to prompt (A/B alternation on a shared machine) and each run starts from a fresh policy, prefills cold and is a
tenant of its own (`cache_salt`), so no variant inherits another's learned draft lengths, copies its output of the
same prompt or reads a prompt another cached. So the suffix index (earlier requests of a tenant) never proposes here,
and a draft model's first reading of the prompt, when the policy tries it, counts as decoding. Speedups are per-prompt ratios of decode-only tokens/s (prefill removed) over
target-only, summarised by their median; greedy outputs are checked token for token against target-only.

    python -m benchmarks.ablation --limit 3 --variants target-only,all,no-arbitration,model-only
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from typing import Any

import typer
from specstruct.testing import run_alone

VARIANTS: dict[str, dict[str, Any]] = {
    "target-only": dict(enable_speculative=False),
    "all": {},
    "no-arbitration": dict(draft_arbitration=False),
    "forced-only": dict(use_prompt_lookup=False, use_structure_guesses=False, use_draft_model=False),
    "lookup-only": dict(use_forced_text=False, use_structure_guesses=False, use_draft_model=False),
    "model-only": dict(use_forced_text=False, use_prompt_lookup=False, use_structure_guesses=False),
    "forced+lookup": dict(use_draft_model=False),
    "no-guesses": dict(use_structure_guesses=False),
    # caps replace only the modes they name: text keeps its own cap
    "cap-4": dict(max_candidates={"json": 4, "code": 4}),
    "cap-16": dict(max_candidates={"json": 16, "code": 16}),
    "draft-float32": dict(draft_numerics="float32"),
    "draft-int8-torchao": {},  # the draft in torch.ao's dynamic int8 (the default before the weight-only kernel)
    "confidence-0.3": dict(draft_confidence=0.3),
    "confidence-0.5": dict(draft_confidence=0.5),
    "text-cap-6": dict(max_candidates={"text": 6}),
    "text-cap-6+confidence-0.5": dict(max_candidates={"text": 6}, draft_confidence=0.5),
    # a second copy of the target whose Linear layers run oneDNN's kernel instead of the fixed-order one
    "linear-onednn": {},
    "target-only-onednn": dict(enable_speculative=False),
}
ONEDNN = ("linear-onednn", "target-only-onednn")
PARTS = ("prefill", "target attention", "target MLP", "target LM head", "target other", "draft model",
         "masks", "forced+lookup+engine", "python/other")


class StepTimer:
    """Forward hooks on the target's attention, MLP and LM head, and a wrapper on the draft runtime, adding up
    wall time per part while `on` is set."""

    def __init__(self, engine: Any):
        self.on, self.t = False, defaultdict(float)
        model = engine.speculator.target.model
        parts = [(model.get_output_embeddings(), "target LM head")]
        for layer in model.model.layers:
            parts += [(layer.self_attn, "target attention"), (layer.mlp, "target MLP")]
        for mod, name in parts:
            mod.register_forward_pre_hook(lambda m, a, name=name: self._start(name))
            mod.register_forward_hook(lambda m, a, o, name=name: self._stop(name))
        self._t0: dict[str, float] = {}

    def _start(self, name: str) -> None:
        self._t0[name] = time.perf_counter()

    def _stop(self, name: str) -> None:
        if self.on:
            self.t[name] += time.perf_counter() - self._t0[name]

    def wrap_draft(self, runtime: Any) -> None:
        for fn in ("forward",):  # the packed passes of proposers/draft_model.py
            inner = getattr(runtime, fn)

            def timed(*a: Any, _inner: Any = inner, _fn: str = fn, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _inner(*a, **kw)
                finally:
                    # a pass that only reads prompt chunks (no logits kept) is part of the prefill
                    reading = _fn == "forward" and not any(a[1] if len(a) > 1 else kw.get("keep", [1]))
                    if self.on and not reading:
                        self.t["draft model"] += time.perf_counter() - t0
            setattr(runtime, fn, timed)


def _shares(stats: Any, t: dict[str, float]) -> dict[str, float]:
    target_in_verify = t["target attention"] + t["target MLP"] + t["target LM head"]
    parts = {
        "prefill": stats.prefill_s,
        "target attention": t["target attention"], "target MLP": t["target MLP"], "target LM head": t["target LM head"],
        "target other": max(0.0, stats.verify_time_s - target_in_verify),
        "draft model": t["draft model"],
        "masks": stats.mask_time_s,
        "forced+lookup+engine": max(0.0, stats.draft_time_s - t["draft model"]),
    }
    parts["python/other"] = max(0.0, stats.elapsed_s - sum(parts.values()))
    return parts


def run(engine: Any, engines: dict[str, Any], workloads: list[Any], variants: list[str], max_new_tokens: int,
        echo: Any = print) -> dict[str, Any]:
    from specstruct.spec.policy import AdaptivePolicy

    timers = {}
    for eng in {id(e): e for e in engines.values()}.values():
        timers[id(eng)] = StepTimer(eng)
        if "model" in eng.speculator.drafters:
            timers[id(eng)].wrap_draft(eng.speculator.drafters["model"].runtime)
    from specstruct.errors import ConstraintError

    rows: list[dict[str, Any]] = []
    for i, w in enumerate(workloads):
        try:
            engine.constraint(w.output_type)
        except ConstraintError as e:  # a schema specstruct refuses (e.g. `not`): no side can run it guaranteed
            echo(f"{w.id:28s} refused: {str(e).splitlines()[0][:100]}")
            continue
        order = variants[i % len(variants):] + variants[: i % len(variants)]
        for v in order:
            eng = engines[v]
            change = {k: x for k, x in VARIANTS[v].items() if k != "draft_numerics"}
            if "max_candidates" in change:
                change["max_candidates"] = {**eng.config.max_candidates, **change["max_candidates"]}
            # a tenant of its own, prefilled cold: no variant copies another's output of this prompt (the suffix index)
            # or reads a prompt another cached
            cfg = eng.config.merged(max_new_tokens=max_new_tokens, cache_salt=f"ablation {v} {i} {w.id}",
                                    use_prefix_cache=False, **change)
            eng.speculator.policy = AdaptivePolicy(cfg, set(eng.speculator.drafters))
            ids = eng.prompt_ids(w.messages, w.output_type, max_new_tokens=max_new_tokens)
            timer = timers[id(eng)]
            timer.t.clear()
            timer.on = True
            try:
                dec = run_alone(eng.speculator.row(ids, eng.constraint(w.output_type).fork(), cfg))
            finally:
                timer.on = False
            st = dec.stats
            rows.append({"prompt": w.id, "variant": v, "token_ids": dec.token_ids, "new_tokens": st.new_tokens,
                         "elapsed_s": st.elapsed_s, "decode_s": st.elapsed_s - st.prefill_s,
                         "drafted": st.drafted, "accepted": st.accepted, "passes": st.target_forwards - 1,
                         "per_drafter": {k: vars(s).copy() for k, s in st.per_drafter.items()},
                         "parts": _shares(st, timer.t)})
            echo(f"{w.id:28s} {v:15s} {st.new_tokens:4d} tok {st.elapsed_s:7.1f}s  passes {st.target_forwards - 1:3d}"
                 f"  accepted {st.accepted}/{st.drafted}")
    return {"rows": rows, "summary": summarize(rows, variants)}


def summarize(rows: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    base = {r["prompt"]: r for r in rows if r["variant"] == "target-only"}
    base_onednn = {r["prompt"]: r for r in rows if r["variant"] == "target-only-onednn"}
    out: dict[str, Any] = {}
    for v in variants:
        rs = [r for r in rows if r["variant"] == v]
        same = base_onednn if v in ONEDNN and base_onednn else base  # greedy output is compared within one kernel
        ratios = [(r["new_tokens"] / r["decode_s"]) / (base[r["prompt"]]["new_tokens"] / base[r["prompt"]]["decode_s"])
                  for r in rs if r["prompt"] in base and r["decode_s"] > 0]
        per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for r in rs:
            for name, s in r["per_drafter"].items():
                for key, val in s.items():
                    per[name][key] += val
        total = sum(sum(r["parts"].values()) for r in rs) or 1.0
        out[v] = {
            "decode_speedup": statistics.median(ratios) if ratios else None,
            "acceptance": sum(r["accepted"] for r in rs) / max(1, sum(r["drafted"] for r in rs)),
            "tokens_per_pass": sum(r["new_tokens"] for r in rs) / max(1, sum(r["passes"] for r in rs)),
            "identical": sum(r["token_ids"] == same[r["prompt"]]["token_ids"] for r in rs if r["prompt"] in same),
            "prompts": len(rs),
            "per_drafter": {k: dict(s) for k, s in per.items()},
            "shares": {p: sum(r["parts"][p] for r in rs) / total for p in PARTS},
        }
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| variant | decode-only speedup (median) | acceptance | tokens/pass | identical | forced | lookup | "
             "guesses | draft model |", "|---|---|---|---|---|---|---|---|---|"]
    for v, s in summary.items():
        def d(name: str) -> str:
            p = s["per_drafter"].get(name)
            return (f"{p['accepted']}/{p['proposed']} (overruled {p.get('overruled', 0)})" if p else "-")
        sp = f"{s['decode_speedup']:.2f}x" if s["decode_speedup"] else "-"
        lines.append(f"| {v} | {sp} | {s['acceptance']:.0%} | {s['tokens_per_pass']:.2f} | {s['identical']}/"
                     f"{s['prompts']} | {d('forced')} | {d('lookup')} | {d('guess')} | {d('model')} |")
    lines += ["", "| variant | " + " | ".join(PARTS) + " |", "|---|" + "---|" * len(PARTS)]
    for v, s in summary.items():
        lines.append(f"| {v} | " + " | ".join(f"{s['shares'][p]:.0%}" for p in PARTS) + " |")
    return "\n".join(lines)


def main(limit: int = typer.Option(3, "--limit", help="prompts"),
         scenario: str = typer.Option("extraction", "--scenario",
                                      help="extraction (typed extraction JSON) | json (the bench's JSON prompts: "
                                           "extraction and JSONSchemaBench interleaved) | code | prose | document "
                                           "(typed extraction from 1,000-3,000-token documents)"),
         variants: str = typer.Option("target-only,all,no-arbitration", "--variants",
                                      help=f"comma-separated, from {','.join(VARIANTS)}"),
         max_new_tokens: int = typer.Option(200, "--max-new-tokens"),
         model: str = typer.Option("qwen2.5-coder-1.5b", "--model"),
         draft: str = typer.Option("qwen2.5-coder-0.5b", "--draft"),
         out: str = typer.Option("", "--out", help="write rows and summary as JSON")) -> None:
    """Ablation of drafters, draft numerics and caps (typed-extraction JSON by default), with a per-part time
    profile."""
    import torch

    import specstruct as ss
    from specstruct.config import EngineConfig

    from specstruct.bench.workloads import extraction_workloads, load_workloads

    if scenario not in ("extraction", "json", "code", "prose", "document"):
        raise typer.BadParameter(f"unknown scenario {scenario!r}: extraction, json, code, prose or document")
    names = [v.strip() for v in variants.split(",") if v.strip()]
    if unknown := [v for v in names if v not in VARIANTS]:
        raise typer.BadParameter(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    eng = ss.SpecStruct.from_pretrained(model, draft=draft)
    engines = {v: eng for v in names}
    if "draft-float32" in names:
        from specstruct.models.loading import load

        f32 = ss.SpecStruct(eng.model, eng.tokenizer, load(draft)[0],
                            engine_config=EngineConfig(draft_numerics="float32"))
        engines["draft-float32"] = f32
    if "draft-int8-torchao" in names or any(v in names for v in ONEDNN):
        from specstruct.runtime import fixed_linear
        from specstruct.runtime.model_runtime import quantize_draft
        from specstruct.models.loading import load

        if "draft-int8-torchao" in names:  # given already quantized: the engine keeps it as is
            ao = quantize_draft(load(draft)[0], torchao=True)
            engines["draft-int8-torchao"] = ss.SpecStruct(eng.model, eng.tokenizer, ao,
                                                          engine_config=EngineConfig(draft_numerics="float32"))
        if any(v in names for v in ONEDNN):
            with fixed_linear.using("onednn"):  # read when the engine packs its weights
                other = ss.SpecStruct(load(model)[0], eng.tokenizer, load(draft)[0])
            engines.update({v: other for v in ONEDNN if v in names})
    workloads = extraction_workloads(limit) if scenario == "extraction" else load_workloads(scenario, limit)
    result = run(eng, engines, workloads, names, max_new_tokens)
    print(markdown(result["summary"]))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    typer.run(main)
