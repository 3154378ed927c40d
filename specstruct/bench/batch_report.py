"""Table, Markdown and plot for `specstruct bench --scenario batch` (see batch_scenario.py for what is measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADERS = ("concurrency", "tok/s batched", "p50 s", "p95 s", "tok/pass", "x one-by-one", "x no-spec", "x hf-static",
           "identical")


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for lv in results["levels"]:
        b, r = lv["sides"].get("batched", {}), lv.get("ratios", {})
        ratio = lambda k: f"{r[k]:.2f}x" if k in r else "-"  # noqa: E731
        tpp = b.get("tokens_per_pass")
        out.append([str(lv["concurrency"]), f"{b.get('tokens_per_s', 0):.2f}", f"{b.get('latency_p50_s', 0):.1f}",
                    f"{b.get('latency_p95_s', 0):.1f}", f"{tpp:.2f}" if tpp else "-", ratio("one-by-one"),
                    ratio("no-spec"), ratio("hf-static"),
                    {True: "yes", False: "NO"}.get(lv.get("identical"), "-")])
    return out


def caption(results: dict[str, Any]) -> str:
    m = results["meta"]
    mc = m["machine"]
    return (f"{m['models']['target']} + draft {m['models']['draft']}; {m['numerics']}; row decoder "
            f"{m['decoder']}; {mc['cpu']}, {mc['cores']} cores, {mc['torch_threads']} torch threads, load average "
            f"{mc.get('load_average_1m')} -> {mc.get('load_average_1m_end')}; max_new_tokens="
            f"{m['settings']['max_new_tokens']}, greedy")


def print_batch_report(results: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    t = Table(title="specstruct: concurrent JSON extraction (ratios = batched tokens/s over each side's)")
    for h in HEADERS:
        t.add_column(h, justify="right")
    for r in rows(results):
        t.add_row(*r)
    console.print(t)
    console.print(caption(results))
    for lv in results["levels"]:
        for side, r in lv["sides"].items():
            if r.get("errors"):
                console.print(f"[yellow]! concurrency {lv['concurrency']} {side}: {len(r['errors'])} requests "
                              f"cut short or invalid ({', '.join(sorted(set(r['errors'])))})[/yellow]")


def batch_markdown(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---:|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    return "\n".join(lines) + f"\n\n{caption(results)}\n"


def batch_plot(results: dict[str, Any], path: str | Path) -> Path:
    """Total tokens/s against concurrency, one line per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    levels = results["levels"]
    for side in ("batched", "one-by-one", "no-spec", "hf-static"):
        pts = [(lv["concurrency"], lv["sides"][side]["tokens_per_s"]) for lv in levels if side in lv["sides"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=side)
    ax.set_xscale("log", base=2)
    ax.set_xticks([lv["concurrency"] for lv in levels], [str(lv["concurrency"]) for lv in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("total new tokens / s")
    ax.set_title("concurrent JSON extraction", fontsize=10)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, caption(results)[:180], fontsize=6)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
