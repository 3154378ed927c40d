"""Presenting results: the rich terminal table, the JSON file, the matplotlib figure.

    write_json(results, "results.json"); print_report(results); plot(results, "bench.png")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specstruct.bench.summary import EXTERNAL, PUBLISHED

SCENARIO_TITLES = {"json": "JSON generation", "code": "code writing", "prose": "prose writing",
                   "document": "document extraction"}


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return _num(None if value is None else 100 * value, "{:.1f}%")


def _counts(c: dict[str, Any] | None) -> str:
    return "-" if not c or not c.get("total") else f"{c['ok']}/{c['total']}"


def write_json(results: dict[str, Any], path: str | Path) -> Path:
    """Every per-prompt figure and the per-scenario summaries, as JSON."""
    path = Path(path)
    path.write_text(json.dumps(results, indent=1, default=str))
    return path


def publish(results: dict[str, Any], console: Any, out: str | None, plot_path: str | None, markdown_out: str | None,
            *, show: Any = None, draw: Any = None, render: Any = None) -> None:
    """Print the report and write what was asked for (`--out`, `--plot`, `--markdown`). `show`, `draw` and `render`
    default to this module's print_report, plot and markdown; other scenarios pass their own."""
    (show or print_report)(results, console)
    if out:
        console.print(f"results written to {write_json(results, out)}")
    if plot_path:
        console.print(f"plot written to {(draw or plot)(results, plot_path)}")
    if markdown_out:
        Path(markdown_out).write_text((render or markdown)(results))
        console.print(f"markdown table written to {markdown_out}")


def table(results: dict[str, Any]) -> Any:
    """The headline table: one row per scenario, medians over prompts (speedup quartiles in brackets)."""
    from rich.table import Table

    present = [b for b in EXTERNAL if any(b in s.get("speedup_vs", {}) for s in results["scenarios"].values())]
    t = Table(title="specstruct benchmark: medians over prompts")
    for col in ("scenario", "n", "target-only\ntok/s", "specstruct\ntok/s", "speedup", "p25-p75", "decode\nspeedup", "accept",
                *[f"vs\n{b}" for b in present], "valid", "same\ntokens"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for name, s in results["scenarios"].items():
        sp = s.get("speedup_spread") or {}
        t.add_row(name, f"{s['prompts']}" + (f" (+{s['skipped']} skipped)" if s["skipped"] else ""),
                  _num(s.get("baseline_tokens_per_s")), _num(s.get("specstruct_tokens_per_s")),
                  _num(s.get("speedup"), "{:.2f}x"), f"{sp['p25']:.2f}-{sp['p75']:.2f}" if sp else "-",
                  _num(s.get("decode_speedup"), "{:.2f}x"), _pct(s.get("acceptance_rate")), *[_num(s["speedup_vs"].get(b), "{:.2f}x") for b in present],
                  _counts(s.get("valid")), _counts(s.get("identical")))
    return t


COLD = ("Prefix cache: off on every specstruct side (cold prefill of every prompt, as for the other sides); "
        "`--scenario pipeline` measures it warm against cold")


def markdown(results: dict[str, Any]) -> str:
    """The headline table as Markdown (for docs/benchmarks.md), with the command, machine and numerics."""
    meta = results["meta"]
    present = [b for b in EXTERNAL if any(b in s.get("speedup_vs", {}) for s in results["scenarios"].values())]
    head = ["scenario", "prompts", "target-only tokens/s", "specstruct tokens/s", "speedup (p25-p75)",
            "decode-only speedup", "acceptance rate", *[f"vs {b}" for b in present], "valid", "identical to target-only"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, s in results["scenarios"].items():
        sp = s.get("speedup_spread") or {}
        speed = _num(s.get("speedup"), "{:.2f}x") + (f" ({sp['p25']:.2f}-{sp['p75']:.2f})" if sp else "")
        cells = [SCENARIO_TITLES.get(name, name), str(s["prompts"]), _num(s.get("baseline_tokens_per_s")),
                 _num(s.get("specstruct_tokens_per_s")), speed, _num(s.get("decode_speedup"), "{:.2f}x"),
                 _pct(s.get("acceptance_rate")),
                 *[_num(s["speedup_vs"].get(b), "{:.2f}x") for b in present], _counts(s.get("valid")),
                 _counts(s.get("identical"))]
        rows.append("| " + " | ".join(cells) + " |")
    m = meta["machine"]
    notes = [f"Command: `{meta['command']}` (started {meta['started']}{'' if meta.get('complete', True) else ', INCOMPLETE'}).",
             f"Models: target {meta['models']['target']}, draft {meta['models']['draft']}; "
             f"max_new_tokens {meta['settings']['max_new_tokens']}, temperature {meta['settings']['temperature']}.",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch threads, load average "
             f"{m.get('load_average_1m')} at start and {m.get('load_average_1m_end')} at end.",
             *[f"Numerics of {side}: {desc}." for side, desc in meta["numerics"].items()], COLD]
    if meta["settings"].get("repeats", 1) > 1:
        notes.append(f"Each prompt ran {meta['settings']['repeats']} times per side, which side went first alternating; "
                     "each side's median run is the one reported.")
    sides = ["| " + " | ".join(SIDE_HEAD) + " |", "|" + "---|" * len(SIDE_HEAD)]
    sides += ["| " + " | ".join(r) + " |" for r in side_rows(results)]
    return "\n".join(rows) + "\n\n" + "\n".join(sides) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def side_rows(results: dict[str, Any]) -> list[list[str]]:
    """Per scenario and side: end-to-end seconds per request, prefill seconds, decode tokens/s, valid (medians)."""
    rows = []
    for name, s in results["scenarios"].items():
        for side in s.get("elapsed_s") or {}:
            rows.append([name, side, _num(s["elapsed_s"].get(side), "{:.2f}"),
                         _num((s.get("prefill_s") or {}).get(side), "{:.2f}"),
                         _num((s.get("decode_tokens_per_s") or {}).get(side)),
                         _counts((s.get("valid_by_side") or {}).get(side))])
    return rows


SIDE_HEAD = ("scenario", "side", "end to end, s/request", "prefill, s", "decode tokens/s", "valid")


def side_table(results: dict[str, Any]) -> Any:
    from rich.table import Table

    t = Table(title="every side: medians over prompts")
    for col in SIDE_HEAD:
        t.add_column(col, justify="left" if col in ("scenario", "side") else "right")
    for row in side_rows(results):
        t.add_row(*row)
    return t


def drafter_table(results: dict[str, Any]) -> Any:
    """Acceptance per drafter and scenario: where the speedup comes from."""
    from rich.table import Table

    t = Table(title="candidates proposed / accepted per drafter")
    for col in ("scenario", "drafter", "proposed", "accepted", "acceptance", "tokens/forward"):
        t.add_column(col, justify="left" if col in ("scenario", "drafter") else "right")
    for name, s in results["scenarios"].items():
        for drafter, d in sorted(s.get("per_drafter", {}).items()):
            t.add_row(name, drafter, str(d["proposed"]), str(d["accepted"]), _pct(d["acceptance_rate"]),
                      _num(s.get("tokens_per_forward")))
    return t


def seed_table(results: dict[str, Any]) -> Any:
    """Per scenario, what this run measured next to the published result's row: speedup over the target alone,
    acceptance, candidates verified per step (pooled; the per-prompt range in brackets)."""
    from rich.table import Table

    t = Table(title="next to the published table (4x A100): measured / published")
    for col in ("scenario", "speedup", "acceptance", "candidates/step (per-prompt range)", "tokens/forward"):
        t.add_column(col, justify="left" if col == "scenario" else "right")
    for name, s in results["scenarios"].items():
        pub = s.get("published_reference") or {}
        cands, rng, span = s.get("candidates_per_step"), s.get("candidates_per_step_spread"), pub.get("candidates_per_step")
        t.add_row(name, f"{_num(s.get('speedup'), '{:.2f}x')} / {_num(pub.get('speedup'), '{:.1f}x')}",
                  f"{_pct(s.get('acceptance_rate'))} / {_pct(pub.get('acceptance_rate'))}",
                  f"{_num(cands)}" + (f" ({rng['min']:.2f}-{rng['max']:.2f})" if rng else "")
                  + f" / {f'{span[0]}-{span[1]}' if span else '-'}", _num(s.get("tokens_per_forward")))
    return t


def problems(results: dict[str, Any]) -> list[str]:
    """Lines naming every invalid output, greedy mismatch, skipped prompt and side error."""
    lines = []
    for r in results["records"]:
        if r["status"] != "ok":
            lines.append(f"{r['id']}: {r['status']} ({r.get('reason', '')[:160]})")
            continue
        for side in ("specstruct", "target-only"):
            if r["valid"].get(side) is False:
                cut = " (cut short by max_new_tokens)" if r["sides"][side].get("finish_reason") == "length" else ""
                lines.append(f"{r['id']}: {side} output invalid{cut}: {r['validation_error'].get(side, '')[:160]}")
        if r["identical"] is False:
            lines.append(f"{r['id']}: greedy specstruct output differs from target-only at token {r['first_mismatch']}")
        for side, err in r["errors"].items():
            lines.append(f"{r['id']}: {side} failed: {err[:160]}")
        if not r.get("same_prompt_tokens", True):
            lines.append(f"{r['id']}: sides saw different prompt lengths")
    return lines


def print_report(results: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    console = console or Console()
    meta = results["meta"]
    console.print(table(results))
    if any(s.get("elapsed_s") for s in results["scenarios"].values()):
        console.print(side_table(results))
    if any(s.get("per_drafter") for s in results["scenarios"].values()):
        console.print(drafter_table(results))
    if any(s.get("candidates_per_step") is not None for s in results["scenarios"].values()):
        console.print(seed_table(results))
    console.print(f"models: target {meta['models']['target']}, draft {meta['models']['draft']} "
                  f"(weights {meta['models']['weights']}); machine: {meta['machine']['cpu']}, "
                  f"{meta['machine']['torch_threads']} torch threads, load average {meta['machine'].get('load_average_1m')} "
                  f"-> {meta['machine'].get('load_average_1m_end')} (above the core count means shared CPU: noisy)")
    for side, desc in meta["numerics"].items():
        console.print(f"numerics {side}: {desc}")
    console.print(COLD.lower())
    for line in problems(results):
        console.print(f"[yellow]! {line}[/yellow]")


def plot(results: dict[str, Any], path: str | Path) -> Path:
    """Left: speedup of specstruct over each baseline per scenario (bars, p25-p75 whiskers; 1.0 line; the
    published multi-GPU figure as a marker). Right: acceptance rate per scenario, overall and per drafter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scen = list(results["scenarios"])
    summaries = [results["scenarios"][s] for s in scen]
    baselines = ["target-only"] + [b for b in EXTERNAL if any(b in s.get("speedup_vs", {}) for s in summaries)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    width, top = 0.8 / len(baselines), 1.5
    for i, base in enumerate(baselines):
        xs, ys, lo, hi = [], [], [], []
        for j, s in enumerate(summaries):
            spread = s.get("speedup_spread") if base == "target-only" else s.get("speedup_vs_spread", {}).get(base)
            if spread:
                xs.append(j + (i - (len(baselines) - 1) / 2) * width)
                ys.append(spread["median"])
                lo.append(spread["median"] - spread["p25"])
                hi.append(spread["p75"] - spread["median"])
        top = max([top] + [y + h for y, h in zip(ys, hi)])
        bars = left.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=f"vs {base}")
        left.bar_label(bars, fmt="%.2fx", fontsize=8)
    pub = [(j, PUBLISHED[s][0]) for j, s in enumerate(scen) if s in PUBLISHED]
    if pub:
        left.scatter(*zip(*pub), marker="_", s=600, color="black", zorder=3, label="published vs target-only (4x A100)")
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_xticks(range(len(scen)), [SCENARIO_TITLES.get(s, s) for s in scen])
    left.set_ylabel("speedup (tokens/s ratio, median over prompts)")
    left.set_title("specstruct speedup")
    left.set_ylim(0, max(top, 4.0) * 1.25)
    left.legend(fontsize=7, loc="upper right", ncol=2)

    drafters = sorted({d for s in summaries for d in s.get("per_drafter", {})})
    groups = ["all"] + drafters
    width = 0.8 / len(groups)
    for i, g in enumerate(groups):
        vals = [(s.get("acceptance_rate") if g == "all" else (s.get("per_drafter", {}).get(g) or {}).get("acceptance_rate"))
                for s in summaries]
        xs = [j + (i - (len(groups) - 1) / 2) * width for j, v in enumerate(vals) if v is not None]
        bars = right.bar(xs, [100 * v for v in vals if v is not None], width, label=g)
        right.bar_label(bars, fmt="%.0f%%", fontsize=8)
    pub = [(j, 100 * PUBLISHED[s][1]) for j, s in enumerate(scen) if s in PUBLISHED]
    if pub:
        right.scatter(*zip(*pub), marker="_", s=600, color="black", zorder=3, label="published (4x A100)")
    right.set_xticks(range(len(scen)), [SCENARIO_TITLES.get(s, s) for s in scen])
    right.set_ylim(0, 130)
    right.set_yticks(range(0, 101, 20))
    right.set_ylabel("accepted / drafted candidates (%)")
    right.set_title("acceptance rate")
    right.legend(fontsize=7, loc="upper right", ncol=3)
    meta = results["meta"]
    fig.suptitle(f"{meta['models']['target']} + draft {meta['models']['draft']} on {meta['machine']['cpu']} "
                 f"({meta['machine']['torch_threads']} threads), max_new_tokens={meta['settings']['max_new_tokens']}",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
