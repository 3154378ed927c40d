"""Tiny, offline stand-ins for real models: a byte-level BPE tokenizer trained in code and random-weight
Qwen2 models over it. Tests and the LangChain package's tests use these; nothing here downloads."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

if TYPE_CHECKING:
    import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "tags": ["math", "code"]}),
    json.dumps({"id": 1, "title": "Report", "done": False, "score": 3.5, "owner": None}),
    json.dumps([{"city": "Paris", "country": "France"}, {"city": "Rome", "country": "Italy"}]),
    json.dumps({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
    '{"a": 1, "b": [true, false, null], "c": {"d": "e"}}',
    "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n",
    "for i in range(10):\n    print(i)\nimport os, sys\nif __name__ == '__main__':\n    main()\n",
    "SELECT name, age FROM people WHERE age > 30 ORDER BY name;",
    "The quick brown fox jumps over the lazy dog. Ada Lovelace wrote the first program in 1843.",
    "Extract the person from this text: Grace Hopper, 85, invented the compiler. Answer with JSON.",
    "yes no maybe true false null positive negative neutral 0123456789 2024-01-31 12:30:00",
]


@functools.lru_cache(maxsize=4)
def tiny_tokenizer(vocab_size: int = 400):
    """A real byte-level BPE tokenizer (GPT-2 style pre-tokenizer, learned merges such as `{"` and `",`),
    with ChatML special tokens and a chat template, as transformers' PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.name_or_path = f"specstruct-tiny-bpe-{vocab_size}"
    return fast


def tiny_model(tokenizer=None, seed: int = 0, hidden: int = 64, layers: int = 2, peaky: float = 4.0,
               dtype: torch.dtype = torch.float32):
    """A random-weight Qwen2 causal LM over `tokenizer`'s vocabulary (padded to a multiple of 8, as real
    checkpoints are). `peaky` scales the LM head so the argmax is decisive rather than a near-tie."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    vocab = (len(tokenizer) + 7) // 8 * 8 + 8
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(peaky)
    return model


def perturbed(model, noise: float = 0.02, seed: int = 1):
    """A copy of `model` with small weight noise: a draft that mostly agrees with its target. The copy has
    stock numerics and plain weights, whatever `model` runs (a runtime switches it as it does any model)."""
    import copy

    from specstruct.runtime.model_runtime import restore_stock

    draft = copy.deepcopy(model)
    restore_stock(draft)  # prepacked (opaque) weights back to plain ones, which can be perturbed
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * p.std().clamp_min(1e-6))
    return draft


class ScriptedRuntime:
    """A stand-in target runtime that writes `script` (token ids) and then EOS, whatever the prompt: the loop,
    the constraint masks, stop strings and streaming run for real on a known output. Where the constraint
    forbids the scripted token, the lowest legal id wins (as with any argmax under a mask)."""

    numerics = "scripted"
    row_invariant, packed, reuses_prefixes = True, False, False  # no KV to reuse: the prefix cache passes it by

    def __init__(self, script: list[int], vocab_size: int, eos_id: int):
        self.script, self.vocab_size, self.eos_id = list(script), vocab_size, eos_id
        self.max_length = None
        self.cache_key = ("scripted", id(self))

    def _row(self, position: int) -> torch.Tensor:
        logits = torch.zeros(self.vocab_size)
        logits[self.script[position] if position < len(self.script) else self.eos_id] = 10.0
        return logits

    def sequence(self, layers=None, length: int = 0) -> "_ScriptedSequence":
        seq = _ScriptedSequence()
        seq.length = length
        return seq

    def forward(self, segments, keep, masks=None) -> list[torch.Tensor]:
        """Each segment's last keep[i] rows; a sequence's first row with logits is the end of its prompt."""
        out = []
        for (seq, ids), want in zip(segments, keep):
            end = seq.length + len(ids)
            if want and seq.prompt is None:
                seq.prompt = end
            rows = [self._row(q + 1 - seq.prompt) for q in range(end - want, end)]
            seq.length = end
            out.append(torch.stack(rows) if rows else torch.empty(0, self.vocab_size))
        return out


class _ScriptedSequence:
    def __init__(self):
        self.length, self.prompt = 0, None

    def crop(self, length: int) -> None:
        self.length = length


def scripted_engine(text: str, tokenizer=None, **config):
    """A SpecStruct over the tiny tokenizer whose target always writes `text` (then EOS); no draft model."""
    import specstruct as ss

    tokenizer = tokenizer or tiny_tokenizer()
    model = tiny_model(tokenizer, hidden=16, layers=1)
    script = ScriptedRuntime(tokenizer.encode(text, add_special_tokens=False), model.config.vocab_size,
                             tokenizer.eos_token_id)
    return ss.SpecStruct(model, tokenizer, config=ss.SpecConfig(**config), target=script)


def slow_steps(monkeypatch, seconds: float) -> None:
    """Make every batched decode step first sleep `seconds` (a long prefill, a big model) for the rest of a test:
    requests stay in flight long enough to cancel, time out, overload or shut down, on any machine."""
    from specstruct.spec.batch import BatchDecoder

    step = BatchDecoder.step

    def slow(self):
        import time

        time.sleep(seconds)
        return step(self)

    monkeypatch.setattr(BatchDecoder, "step", slow)


def tiny_llama(tokenizer=None, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A random-weight Llama causal LM (the architecture whose GGUF files permute q/k rows)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or tiny_tokenizer()
    config = LlamaConfig(vocab_size=(len(tokenizer) + 31) // 32 * 32, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


# transformers' model types that llama.cpp's converter writes under another architecture
GGUF_ARCH = {"mistral": "llama", "gemma3_text": "gemma3"}


def write_gguf(model, path, quant: str | Callable[[str], str] = "Q8_0", metadata=None, seed: int = 0):
    """`model`'s weights as a GGUF file (2-D weights in `quant`, the rest float32), named and laid out as
    llama.cpp's converter (convert_hf_to_gguf.py) writes them: Llama's and Mistral's q/k rows permuted (both are
    its "llama" architecture), Gemma's norm weights stored plus one, a tied LM head left out (the embedding),
    Llama 3's rotary scaling as the `rope_freqs` factors, Phi-3's longrope as `rope_factors_long` / `_short`.
    `quant` is a GGUF type name, or a function from a tensor's GGUF name to one (a mix, as llama.cpp's Q4_K_M).
    A type gguf's writer cannot quantize to (the K-quants, IQ4_XS, IQ4_NL) gets random valid blocks at the weight's
    scale instead (random_gguf_blocks). `metadata(writer)`, where given, adds the file's key-values
    (specstruct.testing_gguf.write_bare_gguf). Returns the float32 model those blocks stand for: `model`'s weights
    replaced by their de-quantized values."""
    import copy

    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter, MODEL_ARCH_NAMES, get_tensor_name_map
    from gguf.quants import dequantize, quantize

    cfg = model.config
    arch_name = GGUF_ARCH.get(cfg.model_type, cfg.model_type)
    arch = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name)
    names = get_tensor_name_map(arch, cfg.num_hidden_layers)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    gemma = cfg.model_type.startswith("gemma")
    type_of = quant if callable(quant) else (lambda _name: quant)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), arch_name)
    if metadata is not None:
        metadata(writer)
    stands_for = copy.deepcopy(model)
    tied = getattr(cfg, "tie_word_embeddings", False)
    for hf_name, tensor in model.state_dict().items():
        head = model.get_output_embeddings()
        if tied and head is not None and hf_name.startswith("lm_head") and \
                tensor.data_ptr() == model.get_input_embeddings().weight.data_ptr():
            continue  # a tied head is the embedding: llama.cpp's converter writes no output.weight
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = names.get_name(base) + "." + suffix
        w = tensor.detach().float().numpy()
        if gemma and hf_name.endswith("norm.weight"):  # Gemma's RMSNorm multiplies by (1 + weight)
            w = w + np.float32(1.0)
            stands_for.get_parameter(hf_name).data.copy_(torch.from_numpy(w - np.float32(1.0)))
        permute = arch_name == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name)
        if permute:
            n = kv_heads if ".attn_k." in gguf_name else heads
            w = w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        if w.ndim == 2:
            kind = getattr(GGMLQuantizationType, type_of(gguf_name))
            try:
                blocks = quantize(w, kind)
            except NotImplementedError:  # no quantizer in gguf-py: random blocks of the weight's size
                blocks = random_gguf_blocks(kind.name, w.shape, float(w.std()), rng)
            writer.add_tensor(gguf_name, blocks, raw_dtype=kind)
            back = dequantize(blocks, kind).reshape(w.shape)
            if permute:  # undo the permutation for the float model
                back = back.reshape(n, w.shape[0] // n // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
            stands_for.get_parameter(hf_name).data.copy_(torch.from_numpy(np.ascontiguousarray(back)))
        else:
            writer.add_tensor(gguf_name, w)
    factors = _llama3_rope_factors(cfg)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    params = cfg.to_dict().get("rope_parameters") or {}
    if cfg.model_type == "phi3" and params.get("long_factor"):  # Phi3MiniModel.generate_extra_tensors
        writer.add_tensor("rope_factors_long.weight", np.array(params["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(params["short_factor"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stands_for


def random_gguf_blocks(kind: str, shape: tuple[int, ...], std: float, rng) -> np.ndarray:
    """Random but valid GGUF blocks of type `kind` for a [rows, cols] weight, as uint8 [rows, bytes per row]:
    random codes and sub-scales, and fp16 super-block scales (and mins) chosen so the weights average about zero and
    have standard deviation `std` (the float weight's: q / k scores, norms and the head keep their sizes). For
    the formats gguf-py can de-quantize but not quantize; the reference is `gguf.quants.dequantize` of these
    bytes."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    from specstruct.runtime.gguf_blocks import DECODERS

    qtype = getattr(GGMLQuantizationType, kind)
    per_block, nbytes = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    if cols % per_block:
        raise ValueError(f"{kind} packs {per_block} inputs a block; the weight has {cols}")
    blocks = rng.integers(0, 256, size=(rows * cols // per_block, nbytes), dtype=np.uint8)
    halves = DECODERS[kind].halves  # the byte offsets of the fp16 scale (and min) in a block

    def weights(*values: np.ndarray) -> np.ndarray:
        for at, v in zip(halves, values):
            blocks[:, at:at + 2] = v.astype(np.float16).reshape(-1, 1).view(np.uint8)
        return dequantize(blocks.reshape(rows, -1), qtype)

    n = len(blocks)
    scale = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    values = [scale]
    if len(halves) == 2:  # w = d * a + m * b: the min at the ratio that cancels the codes' mean
        a, b = weights(np.ones(n), np.zeros(n)), weights(np.zeros(n), np.ones(n))
        values.append(scale * -(a.mean() / b.mean()))
    size = std / max(float(weights(*values).std()), 1e-30)
    weights(*(v * size for v in values))
    return blocks.reshape(rows, -1)


def _llama3_rope_factors(cfg):
    """The per-frequency divisors llama.cpp's converter writes as `rope_freqs.weight` for Llama 3's rotary
    scaling (LlamaModel.generate_extra_tensors), or None for another rotary embedding."""
    import math

    import numpy as np

    params = cfg.to_dict().get("rope_parameters") or {}
    if cfg.model_type not in ("llama", "mistral") or str(params.get("rope_type", "")).lower() != "llama3":
        return None
    base = params.get("rope_theta", 10000.0)
    dim = cfg.to_dict().get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = params.get("factor", 8.0), params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


class OneSequence:
    """One KV sequence on a ModelRuntime, for tests and probes: prefill / extend / crop, each a call of the
    runtime's own packed `forward` (the batch decoder's). Anything else is the runtime's."""

    def __init__(self, model_or_runtime, **runtime_options):
        from specstruct.runtime.model_runtime import ModelRuntime

        self.runtime = model_or_runtime if isinstance(model_or_runtime, ModelRuntime) \
            else ModelRuntime(model_or_runtime, **runtime_options)
        self.seq = None
        self.prefill_chunk = 32  # results do not depend on it (row-wise attention, row-invariant linears)

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    @property
    def cache(self):
        return None if self.seq is None else self.seq.cache

    @property
    def length(self) -> int:
        return 0 if self.seq is None else self.seq.length

    def prefill(self, ids) -> torch.Tensor:
        """Start the sequence on `ids`, read in `prefill_chunk` blocks; logits after the last id [vocab]."""
        self.start([], 0)
        return self.extend_chunked(ids)

    def extend_chunked(self, ids) -> torch.Tensor:
        """Append `ids` in blocks cut at multiples of `prefill_chunk` positions, as the batch decoder reads a
        prompt; logits after the last id [vocab]."""
        ids = list(ids)
        if not ids:
            raise ValueError("nothing to prefill: at least one token must run")
        i, pos, logits = 0, self.length, None
        while i < len(ids):
            n = min(len(ids) - i, self.prefill_chunk - pos % self.prefill_chunk)
            logits = self.extend(ids[i: i + n], last_only=True)
            i, pos = i + n, pos + n
        return logits[-1]

    def start(self, layers: list, length: int) -> None:
        self.seq = self.runtime.sequence(layers, length)

    def kv_layers(self) -> list:
        return self.seq.views()

    def extend(self, ids, *, last_only: bool = False) -> torch.Tensor:
        """Append tokens; their logits [len(ids), vocab] (float32), or [1, vocab] with `last_only`."""
        if self.seq is None:
            raise RuntimeError("call prefill() before extend()")
        return self.runtime.forward([(self.seq, ids)], [1 if last_only else len(ids)])[0]

    def crop(self, length: int) -> None:
        self.seq.crop(length)


def draft_first(speculator: Any) -> Any:
    """For tests of the draft model's own mechanics: a speculator's policy (or a policy) past the free drafters'
    measured arm, in every mode, slow enough (10 s an output token) that a lone row drafts with the draft model from
    its next step."""
    from typing import get_args

    from specstruct.constraints.base import Mode
    from specstruct.spec.policy import ARM_TOKENS

    policy = getattr(speculator, "policy", speculator)
    for mode in get_args(Mode):
        for _ in range(ARM_TOKENS):  # steps of one token: a draft would add tokens to each
            policy.observe_step(mode, False, 1, 10.0)
    return speculator


def steps_alone(row: Any) -> Iterator[list[int]]:
    """Decode one row (`speculator.row(...)`) as a batch of one through the BatchDecoder the scheduler drives,
    without the scheduler's thread: yields the tokens each step committed, raises the row's error at the end."""
    from specstruct.spec.batch import BatchDecoder

    batch = BatchDecoder(row.speculator)
    batch.add(row)
    try:
        while len(batch):
            for _, tokens, _ in batch.step():
                if tokens:
                    yield tokens
    finally:
        batch.remove(row)
    if row.error is not None:
        raise row.error


def run_alone(row: Any) -> Any:
    """`steps_alone` to the end; returns the finished row (token_ids, finish_reason, stats)."""
    for _ in steps_alone(row):
        pass
    return row


def cpu_has(*flags: str) -> bool:
    """Whether /proc/cpuinfo lists every one of `flags` for this CPU (False where there is no /proc): tests that build
    kernels for other vector units run only where this CPU can execute them."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((x for x in f if x.startswith("flags")), "")
    except OSError:
        return False
    return set(flags) <= set(line.split())
