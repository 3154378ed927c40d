"""A GGUF file loads with its blocks kept (decoding/gguf_model.py): transformers' own model class, Linear and
embedding layers on the block-quantized kernel, close to the float model the blocks stand for, and row-invariant
on the production path (batched == alone, a prompt cut anywhere == uncut, cached == cold)."""

import random

import pytest
import torch

from specstruct.decoding import quantized
from specstruct.decoding.gguf_model import load_quantized
from specstruct.decoding.runtime import ModelRuntime
from specstruct.testing import tiny_llama, tiny_model, write_gguf

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
    assert "Q8_0" in ModelRuntime(loaded).numerics and "row-invariant" in ModelRuntime(loaded).numerics


def test_logits_are_the_float_models_within_int8_activation_rounding(pair, tok):
    stands_for, loaded = pair
    ids = torch.tensor([tok.encode('{"name": "Ada", "tags": ["math"]}', add_special_tokens=False)])
    with torch.inference_mode():
        want, got = stands_for(input_ids=ids).logits, loaded(input_ids=ids).logits
    assert ((got - want).norm() / want.norm()).item() < 0.03
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


def test_a_tokens_logits_are_the_same_bits_batched_cut_or_alone(pair, tok):
    _, loaded = pair
    rt = ModelRuntime(loaded)
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

    from specstruct.decoding.gguf_model import read_tensors

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
