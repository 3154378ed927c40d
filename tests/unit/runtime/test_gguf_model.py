"""A GGUF file loads with its blocks kept (runtime/gguf_model.py): transformers' own model class, Linear and
embedding layers on the block-quantized kernel, close to the float model the blocks stand for, and row-invariant
on the production path (batched == alone, a prompt cut anywhere == uncut, cached == cold)."""

import random

import pytest
import torch

from specstruct.runtime import quantized
from specstruct.runtime.gguf_model import load_quantized
from specstruct.testing import tiny_llama, tiny_model, write_gguf
from specstruct.testing import OneSequence

pytest.importorskip("gguf")
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def _kernel():
    try:
        quantized.kernel()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory, _kernel, tok):
    """(the float model the file's blocks stand for, the model loaded from the file)."""
    model = tiny_llama(tok) if request.param == "llama" else tiny_model(tok)
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf"
    stands_for = write_gguf(model, path, "Q8_0")
    return stands_for, load_quantized(path, model.config)


def test_every_linear_and_the_embedding_stay_quantized(pair):
    _, loaded = pair
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.modules())
    assert isinstance(loaded.get_input_embeddings(), quantized.QuantEmbedding)
    assert quantized.describe(loaded).startswith("Q8_0")
    assert "Q8_0" in OneSequence(loaded).numerics and "row-invariant" in OneSequence(loaded).numerics


def test_logits_are_the_float_models_within_int8_activation_rounding(pair, tok):
    stands_for, loaded = pair
    ids = torch.tensor([tok.encode('{"name": "Ada", "tags": ["math"]}', add_special_tokens=False)])
    with torch.inference_mode():
        want, got = stands_for(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert ((got - want).norm() / want.norm()).item() < 0.03
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


def test_a_tokens_logits_are_the_same_bits_batched_cut_or_alone(pair, tok):
    _, loaded = pair
    rt = OneSequence(loaded)
    ids = tok.encode('{"name": "Ada Lovelace", "age": 36, "tags": ["math", "code"], "ok": true}',
                     add_special_tokens=False)
    alone = rt.sequence()
    every = rt.forward([(alone, ids)], [len(ids)])[0]
    rng = random.Random(0)
    cut, other, got, i = rt.sequence(), rt.sequence(), [], 0
    while i < len(ids):  # the same tokens in random pieces, each pass shared with another sequence's tokens
        piece = ids[i : i + rng.randint(1, 7)]
        noise = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 5))]
        mine, _ = rt.forward([(other, noise), (cut, piece)], [len(noise), len(piece)])[::-1]
        got.append(mine)
        i += len(piece)
    assert torch.equal(torch.cat(got), every)


def test_the_tensor_index_is_gguf_readers(tmp_path, tok, _kernel):
    from gguf import GGUFReader

    from specstruct.runtime.gguf_model import read_tensors

    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_model(tok), path, "Q8_0")
    ours, theirs = read_tensors(path), GGUFReader(str(path)).tensors
    assert [(t.name, t.kind) for t in ours] == [(t.name, t.tensor_type.name) for t in theirs]
    for a, b in zip(ours, theirs):
        assert a.shape == tuple(int(d) for d in reversed(b.shape))
        assert a.data.tobytes() == b.data.tobytes()
    with pytest.raises(ValueError, match="not a GGUF file"):
        (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(60))
        read_tensors(tmp_path / "x.gguf")


def test_a_tied_head_computes_on_the_embeddings_blocks(tmp_path, tok, _kernel):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=(len(tok) + 31) // 32 * 32, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(config).eval()
    path = tmp_path / "tied.gguf"
    stands_for = write_gguf(model, path, "Q8_0")
    loaded = load_quantized(path, model.config)
    head, embedding = loaded.get_output_embeddings(), loaded.get_input_embeddings()
    assert isinstance(head, quantized.QuantLinear) and head.qweight is embedding.qweight
    ids = torch.tensor([tok.encode("tied weights", add_special_tokens=False)])
    with torch.inference_mode():
        want, got = stands_for(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert ((got - want).norm() / want.norm()).item() < 0.03


def test_a_nan_input_gives_nan_outputs_not_numbers(_kernel):
    weight = quantized.quantize_float(torch.randn(16, 64))
    x = torch.randn(2, 64)
    x[1, 5] = float("nan")
    y = weight.linear(x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()


def test_a_row_past_the_outputs_is_refused(_kernel):
    weight = quantized.quantize_float(torch.randn(20, 64))  # 2 panels, the second half padding
    with pytest.raises(RuntimeError, match="out of range"):
        weight.rows(torch.tensor([25]))


def test_a_quantized_draft_with_other_padding_rows_gives_the_targets_number_of_logits(tmp_path, tok, _kernel):
    from specstruct.models.loading import matched_draft, output_rows

    target, draft = tiny_model(tok), tiny_llama(tok)
    write_gguf(draft, tmp_path / "draft.gguf", "Q8_0")
    loaded = load_quantized(tmp_path / "draft.gguf", draft.config)
    rows = output_rows(loaded)
    assert rows != output_rows(target)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        own = loaded(input_ids=ids).logits
        matched = matched_draft(tok, tok, target, loaded)  # no float rows to copy: its head wrapped in place
        got = matched(input_ids=ids).logits
    assert output_rows(matched) == output_rows(target) == got.shape[-1]
    keep = min(rows, got.shape[-1])
    assert torch.equal(got[..., :keep], own[..., :keep])  # its own logits; -inf for padding ids past them
    assert torch.isneginf(got[..., keep:]).all()


def test_loading_widens_no_tensor_larger_than_one_layer(tmp_path, _kernel, monkeypatch):
    """The embedding and the LM head (vocabulary x hidden, here 14x a decoder layer) stay blocks while loading: the
    only float32 the loader makes (gguf's dequantize: norms, biases) is smaller than one layer, and numpy's largest
    moment while loading (tracemalloc counts every numpy buffer) stays under half a float32 copy of the head."""
    import tracemalloc

    import gguf.quants
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=16384, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    path = tmp_path / "wide-vocab.gguf"
    write_gguf(model, path, "Q8_0")
    layer = 4 * sum(p.numel() for p in model.model.layers[0].parameters())
    head = 4 * model.lm_head.weight.numel()
    widened = []
    dequantize = gguf.quants.dequantize

    def recorded(data, qtype):
        out = dequantize(data, qtype)
        widened.append(out.nbytes)
        return out

    monkeypatch.setattr(gguf.quants, "dequantize", recorded)
    tracemalloc.start()
    try:
        loaded = load_quantized(path, config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(loaded.lm_head, quantized.QuantLinear)
    assert widened and max(widened) < layer < head
    assert peak < head / 2, f"{peak / 2**20:.1f} MiB of numpy buffers at once while loading (a head is {head / 2**20:.1f})"
