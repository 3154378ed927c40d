"""The attention and decode-step A/B benchmarks' plumbing on the tiny model (the figures come from the real pair):
both sides are timed on the same context, give the same logits to float32 precision, and the model is left as the
engine uses it."""

from __future__ import annotations

import pytest

from benchmarks import attention_ab, step_ab
from specstruct.runtime import packed
from specstruct.testing import tiny_model, tiny_tokenizer
from specstruct.runtime.owned import hand_over, peek


def test_attention_ab_times_both_attentions_and_leaves_the_kernel_on():
    if packed.attention_kernel() != "cpp":
        pytest.skip(packed._KERNEL.error or "SPECSTRUCT_ATTENTION=torch")
    model = tiny_model(tiny_tokenizer(), seed=0)
    rows = attention_ab.compare(model, [1, 9], repeats=1, cache=20)
    assert [k for k, *_ in rows] == [1, 9]
    assert all(cpp > 0 and ops > 0 and diff < 1e-4 for _, cpp, ops, diff in rows)
    assert peek(model).attention == "cpp"


def test_step_ab_times_transformers_and_the_runtime_on_the_same_context():
    tok = tiny_tokenizer()
    stock, ours = tiny_model(tok, seed=0), tiny_model(tok, seed=0)
    s, o, diff = step_ab.compare(stock, ours, cache_len=20, repeats=2)
    assert s > 0 and o > 0 and diff < 1e-4
    assert "row-invariant" in peek(ours).numerics and not peek(stock).numerics


def test_step_breakdown_times_the_parts_and_puts_the_model_back():
    from benchmarks import step_breakdown
    from specstruct.runtime.model_runtime import ModelRuntime

    model = tiny_model(tiny_tokenizer(), seed=0)
    hand_over(model)
    ModelRuntime(model)  # switched to the runtime's kernels first, as the engine does the models it loads
    forwards = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    parts = step_breakdown.breakdown(model, cache=20, repeats=3)
    assert parts["step"] > 0 and {"linear layers", "lm head", "attention", "kv cache update", "rmsnorm"} <= set(parts)
    assert all(v >= 0 for k, v in parts.items() if k != "other small ops and Python")
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == forwards


def test_step_breakdown_times_the_runtime_copy_of_a_model_it_was_not_handed():
    """A model nobody handed over is copied by the runtime: the parts are that copy's (its LM head among them),
    and the caller's model is left as it was."""
    from benchmarks import step_breakdown

    model = tiny_model(tiny_tokenizer(), seed=0)
    forwards = {name: m.__dict__.get("forward") for name, m in model.named_modules()}
    parts = step_breakdown.breakdown(model, cache=20, repeats=3)
    assert parts["lm head"] > 0 and parts["linear layers"] > 0
    assert {name: m.__dict__.get("forward") for name, m in model.named_modules()} == forwards


def test_step_breakdown_restricts_a_block_quantized_head_and_refuses_others(close_draft):
    import copy

    from benchmarks import step_breakdown
    from specstruct.runtime.gguf_model import quantize_linears

    q8 = quantize_linears(copy.deepcopy(close_draft), "q8_0")
    parts = step_breakdown.breakdown(q8, cache=20, repeats=3, head_tokens=200)
    assert parts["lm head"] > 0 and parts["linear layers"] > 0
    with pytest.raises(ValueError, match="draft_head_tokens=408"):  # the tiny vocabulary's whole head
        step_breakdown.breakdown(q8, cache=20, repeats=3, head_tokens=408)
    with pytest.raises(ValueError, match="GGUF blocks"):  # a float32 head has no panels to restrict
        step_breakdown.breakdown(copy.deepcopy(close_draft), cache=20, repeats=3, head_tokens=200)


def test_huge_pages_times_the_same_weights_on_both_page_sizes(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    from benchmarks import huge_pages
    from specstruct.runtime.gguf_model import load_model
    from specstruct.testing import OneSequence
    from specstruct.testing_gguf import write_bare_gguf

    from specstruct import settings

    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path / "cache"))  # the file's converted metadata goes here
    settings.cache_clear()
    tok = tiny_tokenizer()
    path = tmp_path / "Tiny-Q8_0.gguf"
    write_bare_gguf(tiny_model(tok, seed=0), tok, path, "Q8_0")
    model, _ = load_model(str(path))
    hand_over(model)
    rt = OneSequence(model)
    packed_before = [w.packed for w in huge_pages.block_weights()]
    same, rows = huge_pages.compare(rt, [1, 3], cache=12, repeats=1, rounds=2)
    assert same and list(rows) == ["1 tokens at 12", "3 tokens at 12"]
    assert all(a > 0 and b > 0 and r > 0 for a, b, r in rows.values())
    after = [w.packed for w in huge_pages.block_weights()]
    assert len(after) == len(packed_before) and all(a is b for a, b in zip(after, packed_before))  # its own again
