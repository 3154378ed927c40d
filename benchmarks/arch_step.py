"""The fused decoder layer's step per parameter on every architecture the runtime computes, against Qwen2's.

    python -m benchmarks.arch_step [--hidden 1024] [--layers 12] [--ks 1,9] [--cache 200] [--repeats 9] [--rounds 3]

Each architecture of specstruct.testing_gguf.ARCHS gets a random-weight model of the same shape (hidden size,
heads of 64 dimensions, 4 key/value heads, a 4x MLP; a small vocabulary, so the layers are what is timed), written
as a bare Q8_0 GGUF file the way llama.cpp's converter writes it and loaded through the production path. Windows
are wider than the cached prefix (a window shortens attention; the layers' cost is what is compared). A pass of k
tokens on `--cache` cached tokens is timed on each, the architectures interleaved round by round; printed: the
median milliseconds, milliseconds per million layer parameters, and that figure over Qwen2's (the goal: within
1.10). Every model must report the fused row-invariant path, or the run stops.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.step_cost import measure
from specstruct.testing import OneSequence

ARCHS = ["qwen2", "llama3", "mistral", "qwen3", "gemma2", "gemma3", "phi3"]
HEAD_DIM, KV_HEADS = 64, 4


def model_of(name: str, hidden: int, layers: int):
    """A random-weight model of `name`'s architecture at the common shape (testing_gguf.ARCHS' traits kept)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specstruct.testing import tiny_tokenizer
    from specstruct.testing_gguf import ARCHS as TRAITS

    tokenizer = tiny_tokenizer()
    model_type, extra = TRAITS[name]
    extra = dict(extra)
    for key in ("sliding_window",):
        if extra.get(key):
            extra[key] = 4096
    extra.update(head_dim=HEAD_DIM) if "head_dim" in extra else None
    extra.update(query_pre_attn_scalar=HEAD_DIM) if "query_pre_attn_scalar" in extra else None
    extra.pop("num_hidden_layers", None)
    config = AutoConfig.for_model(model_type, **{
        "vocab_size": len(tokenizer) if model_type == "gemma3_text" else (len(tokenizer) + 7) // 8 * 8 + 8,
        "hidden_size": hidden, "intermediate_size": hidden * 4, "num_hidden_layers": layers,
        "num_attention_heads": hidden // HEAD_DIM, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": None, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    return model, tokenizer


def layer_parameters(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)


def load(name: str, hidden: int, layers: int, folder: Path) -> tuple[OneSequence, int, str]:
    from specstruct.runtime.gguf_model import load_model
    from specstruct.testing_gguf import write_bare_gguf

    model, tokenizer = model_of(name, hidden, layers)
    path = folder / f"{name}.gguf"
    write_bare_gguf(model, tokenizer, path, "Q8_0", name=f"Bench {name}")
    loaded, _ = load_model(str(path))
    rt = OneSequence(loaded)
    return rt, layer_parameters(model), rt.runtime.numerics


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default=",".join(ARCHS), help="comma-separated, from: " + ", ".join(ARCHS))
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size of every model (heads of 64)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--ks", default="1,9", help="tokens per pass")
    ap.add_argument("--cache", type=int, default=200, help="cached tokens before each pass")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    names, ks = a.archs.split(","), [int(k) for k in a.ks.split(",")]
    runs: dict[str, list[dict[int, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {}
        for n in names:
            loaded[n] = load(n, a.hidden, a.layers, Path(tmp))
            rt, params, numerics = loaded[n]
            if "fused decoder layers" not in numerics or "row-invariant" not in numerics:
                raise SystemExit(f"{n}: not on the fused row-invariant path: {numerics}")
            print(f"{n}: {params / 1e6:.1f} M layer parameters; {numerics}", flush=True)
        for r in range(a.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                ms = measure(loaded[n][0], ks, a.cache, 0, a.repeats)
                runs[n].append({k: ms[f"{k} tokens at {a.cache}"] for k in ks})
    base = {k: statistics.median(x[k] for x in runs["qwen2"]) / loaded["qwen2"][1] for k in ks} \
        if "qwen2" in runs else None
    print(f"\n{a.layers} layers, hidden {a.hidden}, Q8_0, {a.cache} cached tokens; medians of {a.rounds} rounds x "
          f"{a.repeats}")
    print("| architecture | M layer params | " + " | ".join(f"{k} tok ms | ms/M | x qwen2" for k in ks) + " |")
    print("|---|---|" + "---|---|---|" * len(ks))
    for n in names:
        params = loaded[n][1]
        cells = []
        for k in ks:
            ms = statistics.median(x[k] for x in runs[n])
            per = ms / params
            cells.append(f"{ms:.2f} | {per * 1e6:.4f} | {per / base[k]:.2f}" if base else f"{ms:.2f} | {per * 1e6:.4f} | -")
        print(f"| {n} | {params / 1e6:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
