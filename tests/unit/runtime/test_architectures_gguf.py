"""Every architecture of runtime/architectures.py as a user downloads it: a bare GGUF file laid out as llama.cpp's
converter writes it (specstruct.testing_gguf: its architecture name, hyperparameter keys, tensor names, Gemma's
norms plus one, Llama 3's rope_freqs, a tokenizer and chat template in the metadata), loaded through the production
path (SpecStruct.from_pretrained on the bare file) and compared with transformers' float model of the de-quantized
weights, with each trait on where the file can carry it: Gemma's sliding window shorter than the prompt and Gemma 2's
soft-caps, Gemma 3's scaled global rotary, Qwen3's q/k norms and head dimension, Phi-3's fused projections, window
and partial rotary, Llama 3's rotary scaling, Qwen2.5's YaRN. Each architecture runs twice on the fused path: in
Q8_0, and in a K-quant mix of random valid blocks (MIXES) against the float model of those blocks' de-quantized
values."""

from __future__ import annotations

import json

import pytest
import torch

import specstruct as ss
from specstruct.config import SpecConfig
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.runtime import fused_layer
from specstruct.runtime.gguf_model import load_model
from specstruct.testing import perturbed, run_alone, tiny_tokenizer
from specstruct.testing_gguf import ARCHS, tiny_arch, tiny_spm_tokenizer, write_bare_gguf

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

PROMPTS = [
    "Extract the person from this text: Grace Hopper, 85, invented the compiler. Answer with JSON.",
    'Copy this JSON exactly: {"name": "Ada Lovelace", "age": 36, "tags": ["math", "code"]}',
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n",
]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("cache")
        mp.setenv("SPECSTRUCT_CACHE", str(root))
        mp.setenv("SPECSTRUCT_HOME", str(root / "home"))  # no pulled registry model in sight
        yield root


@pytest.fixture(scope="module", params=list(ARCHS))
def case(request, tmp_path_factory, cache):
    """(name, the float model a Q8_0 file stands for, the one its F16 file stands for, the Q8_0 file, the F16 file,
    a Q8_0 draft file: a perturbed copy)."""
    name = request.param
    tok = tiny_spm_tokenizer() if name.startswith("gemma") else tiny_tokenizer()
    model = tiny_arch(name, tok)
    folder = tmp_path_factory.mktemp(name)
    q8, f16, draft = folder / f"Tiny-{name}-Q8_0.gguf", folder / f"Tiny-{name}-F16.gguf", folder / "draft.gguf"
    q8_model = write_bare_gguf(model, tok, q8, "Q8_0", name=f"Tiny {name}")
    f16_model = write_bare_gguf(model, tok, f16, "F16", name=f"Tiny {name}")
    write_bare_gguf(perturbed(model, noise=0.05), tok, draft, "Q8_0", name=f"Tiny {name} draft")
    return name, q8_model, f16_model, q8, f16, draft


@pytest.fixture(scope="module")
def engine(case):
    name, _, _, q8, _, draft = case
    if fused_layer._KERNEL.load() is None:
        pytest.skip(fused_layer._KERNEL.error)
    with ss.SpecStruct.from_pretrained(str(q8), draft=str(draft), config=SpecConfig(max_new_tokens=24)) as eng:
        yield eng


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def _reference(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits at every position [len(ids), vocab]. Longrope picks its factors by a pass's longest
    position, so there each position is its own pass over the cache (the factors of a one-token step: the
    runtime's, architectures.per_row_rotary); elsewhere one pass."""
    from transformers import DynamicCache

    from specstruct.runtime.model_runtime import cache_kwarg

    if "longrope" not in str(getattr(model.config, "rope_parameters", "")):
        return model(input_ids=torch.tensor([ids])).logits[0]
    cache = {cache_kwarg(model): DynamicCache()}
    return torch.cat([model(input_ids=torch.tensor([[t]]), use_cache=True, **cache).logits[0] for t in ids])


TRAITS = ("head_dim", "sliding_window", "layer_types", "attn_logit_softcapping", "final_logit_softcapping",
          "query_pre_attn_scalar", "rope_parameters")


def test_the_config_read_from_the_file_states_every_trait(case):
    """What transformers' GGUF conversion leaves out (models/gguf_hparams.py) is read from the file's own keys, as
    llama.cpp reads them: each trait the model has, the value it has."""
    from specstruct.runtime.gguf_model import gguf_config

    name, model, _, q8, _, _ = case
    got, want = gguf_config(q8), model.config
    for field in TRAITS:
        if name in ("llama3", "mistral") and field in ("rope_parameters", "sliding_window"):
            continue  # Llama 3's scaling ships as rope_freqs (the next test); a "llama" file has no window
        if hasattr(want, field):
            assert getattr(got, field) == getattr(want, field), (name, field)


@torch.inference_mode()
def test_the_file_loads_as_the_model_it_was_converted_from(case):
    """16-bit weights, stock forward: the config read from the file's metadata and the tensors' layout are the
    model's own to the last bit (a wrong head dimension, window, soft-cap, query scale or rotary shows here)."""
    name, _, want_model, _, f16, _ = case
    model, tokenizer = load_model(str(f16))
    assert model.config.model_type == want_model.config.model_type or name == "mistral"  # written as "llama"
    for text in PROMPTS:
        ids = torch.tensor([_ids(tokenizer, text)])
        got, want = model(input_ids=ids).logits, want_model(input_ids=ids).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_the_file_widened_to_float32_is_the_same_model(case):
    """weights="float32" (transformers' own GGUF loader, every weight de-quantized) on the same config: the same
    model as the blocks kept."""
    name, _, want_model, _, f16, _ = case
    model, tokenizer = load_model(str(f16), weights="float32")
    ids = torch.tensor([_ids(tokenizer, PROMPTS[0])])
    torch.testing.assert_close(model(input_ids=ids).logits, want_model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_the_engine_computes_what_transformers_does_on_the_fused_row_invariant_path(case, engine, monkeypatch):
    """Q8_0 blocks with int8 activations per group: logits at every prompt position within that rounding, the greedy
    next token the float model's wherever its choice is decisive, through transformers' own layers never."""
    name, want_model, _, _, _, _ = case
    _fused_logits_match(name, engine, want_model, monkeypatch)


def test_greedy_speculative_equals_target_only_on_json(case, engine):
    """The bench's guarantee on each architecture: JSON-constrained greedy output with the draft == the target's
    alone, token for token; the result names the row-invariant fused path."""
    _speculative_equals_target_only(case[0], engine)


# Each architecture in a K-quant (IQ4_XS counted) with its ffn_down tensors in a second format, as llama.cpp's mixes
# hold a file (Q4_K_M: Q6_K there): every format the kernel computes appears at least once.
MIXES = {"qwen2": ("Q4_K", "Q6_K"), "qwen2-yarn": ("Q6_K", "Q4_K"), "llama3": ("Q5_K", "Q4_0"),
         "mistral": ("Q6_K", "Q4_1"), "qwen3": ("Q3_K", "Q5_0"), "gemma2": ("Q2_K", "Q5_1"),
         "gemma3": ("IQ4_XS", "IQ4_NL"), "phi3": ("Q4_K", "Q8_0"), "phi3-longrope": ("Q5_K", "Q3_K")}


@pytest.fixture(scope="module", params=list(ARCHS))
def kquant(request, tmp_path_factory, cache):
    """(name, the float model the file stands for, an engine on the file with a Q8_0 draft). The weights are random
    valid blocks (gguf-py quantizes to none of these formats) of 256 inputs a row or a multiple: a super-block."""
    if fused_layer._KERNEL.load() is None:
        pytest.skip(fused_layer._KERNEL.error)
    name = request.param
    main, down = MIXES[name]
    tok = tiny_spm_tokenizer() if name.startswith("gemma") else tiny_tokenizer()
    folder = tmp_path_factory.mktemp(f"{name}-{main}")
    path, draft = folder / f"Tiny-{name}-{main}.gguf", folder / "draft.gguf"
    stands_for = write_bare_gguf(tiny_arch(name, tok, hidden=256, heads=16), tok, path,
                                 lambda tensor: down if ".ffn_down." in tensor else main, name=f"Tiny {name}")
    write_bare_gguf(perturbed(stands_for, noise=0.05), tok, draft, "Q8_0", name=f"Tiny {name} draft")
    with ss.SpecStruct.from_pretrained(str(path), draft=str(draft), config=SpecConfig(max_new_tokens=24)) as eng:
        yield name, stands_for, eng


def test_a_k_quant_file_keeps_its_blocks_and_computes_the_float_models_logits(kquant, monkeypatch):
    """The file's K-quant (and its second format) kept as blocks, every layer fused and row-invariant; logits within
    int8 activation rounding of transformers' float model of `gguf.quants.dequantize` of the same bytes."""
    name, want_model, engine = kquant
    for fmt in MIXES[name]:
        assert f"{fmt} x" in engine.numerics, (name, engine.numerics)
    _fused_logits_match(name, engine, want_model, monkeypatch)


def test_a_k_quant_file_drafts_to_the_same_json_as_its_target_alone(kquant):
    _speculative_equals_target_only(kquant[0], kquant[2])


def _fused_logits_match(name: str, engine, want_model, monkeypatch) -> None:
    """Every decoder layer on the fused path (transformers' own layer raises if it runs), the logits at every
    prompt position within 4% of the float model's (relative norm: int8 activations per group of 16 or 32 inputs
    round each product by about 1%, test_quantized), the greedy token the float model's wherever its margin is
    over 4x the largest logit difference."""
    assert "row-invariant" in engine.numerics and "fused decoder layers" in engine.numerics, engine.numerics
    runtime = engine.runtime
    layers = runtime.model.model.layers
    assert all(layer.forward.func is fused_layer.fused_forward for layer in layers)

    prompts = [_ids(engine.tokenizer, text) for text in PROMPTS]
    with torch.inference_mode():  # the reference first: the check below stops transformers' layers running
        wants = [_reference(want_model, ids) for ids in prompts]

    def stock(*args, **kwargs):
        raise AssertionError(f"transformers' {type(layers[0]).__name__} ran")

    monkeypatch.setattr(type(layers[0]), "forward", stock)
    decisive = 0
    for ids, want in zip(prompts, wants):
        got = runtime.forward([(runtime.sequence(), ids)], [len(ids)])[0]
        assert ((got - want).norm() / want.norm()).item() < 0.04, name
        top2 = want.topk(2, dim=-1).values
        sure = (top2[:, 0] - top2[:, 1]) > 4 * (got - want).abs().max()
        assert torch.equal(got.argmax(-1)[sure], want.argmax(-1)[sure]), name
        decisive += int(sure.sum())
    assert decisive >= len(PROMPTS)


def _speculative_equals_target_only(name: str, engine) -> None:
    """JSON-constrained greedy output with the draft == the target's alone, token for token, on two prompts; the
    result names the row-invariant fused path."""
    spec = ConstraintSpec("json", json.dumps(PERSON))
    constraint = compile_constraint(spec, engine.tokenizer, vocab_size=engine.runtime.vocab_size,
                                    eos_token_ids=engine.eos_token_ids)
    drafted = 0
    for text in PROMPTS[:2]:
        ids = engine.prompt_ids(text)
        rows = [run_alone(engine.speculator.row(ids, constraint.fork(), SpecConfig(
            enable_speculative=speculative, max_new_tokens=24))) for speculative in (False, True)]
        assert rows[1].token_ids == rows[0].token_ids, (name, text)
        drafted += rows[1].stats.drafted
    assert drafted > 0
    result = engine.run(PROMPTS[0], max_new_tokens=4)
    assert "row-invariant" in result.stats.numerics and "fused decoder layers" in result.stats.numerics


@pytest.mark.parametrize("name", ["phi3", "gemma2"])
def test_a_sentencepiece_vocabulary_reads_back_as_the_tokenizer_it_was_written_from(name, tmp_path, cache):
    """A "llama" (sentencepiece) vocabulary as Phi-3's files (a "▁" before the text: add_space_prefix) and Gemma's
    (none) carry it, with tokens, scores, types and byte pieces: the tokenizer transformers' GGUF conversion builds
    from the metadata gives the source tokenizer's ids, text outside the vocabulary through its <0x..> byte pieces,
    <bos> first as the file asks, and decodes back to the text."""
    source = tiny_spm_tokenizer(space_prefix=name == "phi3")
    path = tmp_path / f"Tiny-{name}-spm.gguf"
    write_bare_gguf(tiny_arch(name, source), source, path, "Q8_0")
    _, tokenizer = load_model(str(path))
    for text in [*PROMPTS, "naïve café ☃ 東京", "  two  spaces,\ta tab\n\nand lines "]:
        want = source.encode(text, add_special_tokens=False)
        assert tokenizer.encode(text, add_special_tokens=False) == want, text
        assert tokenizer.encode(text) == [source.bos_token_id, *want], text
        assert tokenizer.decode(want) == text
    assert "<0xE2>" in source.convert_ids_to_tokens(source.encode("☃", add_special_tokens=False))


@torch.inference_mode()
def test_a_llama_file_named_mistral_loads_as_mistral_with_its_blocks(tmp_path, cache):
    """llama.cpp writes Mistral as "llama"; transformers' GGUF config turns a file whose general.name is exactly
    "mistral" into model type "mistral", which gguf-py's tensor map does not name: the blocks are still matched as
    llama's, and the logits are the model's."""
    tok = tiny_tokenizer()
    path = tmp_path / "mistral.gguf"
    want = write_bare_gguf(tiny_arch("mistral", tok), tok, path, "F16", name="mistral")
    model, tokenizer = load_model(str(path))
    assert model.config.model_type == "mistral"
    ids = torch.tensor([tokenizer.encode(PROMPTS[0])])
    torch.testing.assert_close(model(input_ids=ids).logits, want(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
