"""A transformers model whose Linear and embedding weights stay in their GGUF formats.

The model is transformers' own class, built from the config with its parameters on the meta device (no float32
copy is ever allocated). Each GGUF tensor is matched to its parameter by gguf-py's tensor name map for the
architecture (as transformers' GGUF loader does); quantized Linear and embedding weights become runtime.quantized's
QuantLinear / QuantEmbedding on the file's blocks, F16 / BF16 ones runtime.half_linear's HalfLinear / HalfEmbedding
on 16-bit panels, everything else (norms, biases) is de-quantized and passed through the architecture's
transformers tensor processor as transformers' GGUF loader does. A processor that reorders rows (llama's q/k
permutation) is applied to the blocks as the same reordering of output rows. Nothing is copied whole: blocks
and 16-bit weights are read from the mapped file a few thousand rows at a time, a float32 Linear weight stays
a view of the file until the runtime packs it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch

from specstruct.runtime import half_linear
from specstruct.runtime.architectures import config_of, rope_types
from specstruct.runtime.load_memory import page_out_range, trim_heap
from specstruct.runtime.half_linear import HalfEmbedding, HalfLinear, HalfWeight
from specstruct.runtime.gguf_blocks import DECODERS
from specstruct.runtime.quantized import QuantEmbedding, QuantLinear, QuantWeight, from_gguf_blocks

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PretrainedConfig

log = logging.getLogger(__name__)


@dataclass
class Tensor:
    name: str
    kind: str           # the GGML type name: "Q4_K", "F32"
    shape: tuple[int, ...]  # rows first (numpy order)
    data: np.ndarray    # raw bytes [rows, bytes per row], a view of the mapped file


def read_tensors(path: Path) -> list[Tensor]:
    """The tensors of a GGUF file (v2/v3) as views of the mapped file (models.gguf_header reads the header without
    decoding the metadata: gguf's GGUFReader decodes every field, a 151k-token vocabulary, and took 16 of a 1.5B
    model's 36 s load)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from specstruct.models.gguf_header import read_header

    header = read_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: a tensor viewing the file may be written
    tensors = []
    for info in header.tensors:
        qtype = GGMLQuantizationType(info.kind)
        block, size = GGML_QUANT_SIZES[qtype]
        dims = info.dims
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * size
        at = header.data_start + info.offset
        if at + rows * row_bytes > header.size:
            raise ValueError(f"{path}: tensor {info.name} ends past the end of the file (a partial download?)")
        data = mm[at : at + rows * row_bytes].reshape(rows, row_bytes)
        tensors.append(Tensor(info.name, qtype.name, tuple(reversed(dims)), data))
    return tensors


def gguf_config(path: Path) -> PretrainedConfig:
    """The transformers config stored in a GGUF file's metadata (converted once per file, then read from the
    cache: models.bare_gguf)."""
    from transformers import AutoConfig

    from specstruct.models.loading import metadata_source

    return cast("PretrainedConfig", AutoConfig.from_pretrained(str(metadata_source(path))))


class _Processed(Protocol):
    weights: np.ndarray


class _Processor(Protocol):
    """What the loader uses of transformers' GGUF tensor processor for an architecture."""

    config: dict[str, object]

    def process(self, *, weights: np.ndarray, name: str, tensor_key_mapping: dict[str, str],
                parsed_parameters: dict[str, object]) -> _Processed: ...


def _processor(config: PretrainedConfig) -> _Processor:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = _ARCH_NAMES.get(config.model_type, config.model_type)  # transformers keys them by gguf-py's names
    make = cast("Callable[..., _Processor]", TENSOR_PROCESSORS.get(arch, TensorProcessor))
    return make(config=config.to_dict())


def _row_order(processor: _Processor, name: str, rows: int, mapping: dict[str, str]) -> np.ndarray | None:
    """The output-row order the processor gives tensor `name` (None: unchanged). Refuses any other change."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor

    if type(processor).process is TensorProcessor.process:
        return None
    probe = np.arange(rows, dtype=np.float64)[:, None]
    out = processor.process(weights=probe.copy(), name=name, tensor_key_mapping=mapping,
                            parsed_parameters={"config": processor.config, "tensors": {}}).weights
    out = np.asarray(out)
    if out.shape == probe.shape and np.array_equal(out, probe):
        return None
    if out.shape == probe.shape and np.array_equal(np.sort(out[:, 0]), probe[:, 0]):
        return out[:, 0].astype(np.int64)
    raise NotImplementedError(f"{type(processor).__name__} changes {name} beyond reordering its rows")


def _release(tensor: Tensor) -> None:
    """Give back the file pages a converted tensor was read from (the file is read once; its pages would otherwise
    stay resident beside the converted weights until the mapping closes)."""
    page_out_range(tensor.data.ctypes.data, tensor.data.nbytes)


def _float32_view(processor: _Processor, tensor: Tensor, mapping: dict[str, str]) -> torch.Tensor | None:
    """A F32 tensor as a view of the mapped file (its rows reordered where the processor reorders them), or None
    (another type, or a processor that changes more than the row order: it goes through the processor)."""
    if tensor.kind != "F32" or len(tensor.shape) != 2:
        return None
    try:
        order = _row_order(processor, tensor.name, tensor.shape[0], mapping)
    except NotImplementedError:
        return None
    rows = tensor.data if order is None else tensor.data[order]
    return torch.from_numpy(rows.view(np.float32).reshape(tensor.shape))


def _set(model: torch.nn.Module, dotted: str, value: torch.Tensor | torch.nn.Module) -> None:
    parent_name, _, attr = dotted.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(value, torch.nn.Module):
        setattr(parent, attr, value)
    else:
        parent._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)


# transformers' model types whose gguf-py architecture name differs (as transformers' own GGUF loader maps them)
# (llama.cpp writes Mistral as "llama"; transformers calls it "mistral" when the file's name is exactly that)
_ARCH_NAMES = {"mistral": "llama", "cohere": "command-r", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
               "gemma3_text": "gemma3", "gemma4_text": "gemma4", "umt5": "t5", "minimax_m2": "minimax-m2", "gpt_oss": "gpt-oss"}


def _gguf_names(model: torch.nn.Module) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, by gguf-py's tensor name map for its architecture."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    cfg = config_of(model)
    wanted = _ARCH_NAMES.get(cfg.model_type, cfg.model_type)
    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == wanted), None)
    if arch is None:
        raise NotImplementedError(f"gguf-py has no architecture {wanted!r}; load this model with weights='float32'")
    names = get_tensor_name_map(arch, cfg.num_hidden_layers)
    mapping: dict[str, str] = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is not None:
            mapping.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return mapping


def load_quantized(path: Path, config: PretrainedConfig | None = None) -> torch.nn.Module:
    """The model of GGUF file `path` (with `config`, default the file's own) in eval mode, quantized and 16-bit
    weights kept. A Linear weight in a quantized type the kernel does not compute (IQ1-IQ3, TQ: below 3 bits) is
    refused by name (weights='float32' widens it, through transformers' loader); F16 / BF16 are widened only where
    the fixed-order kernel cannot be built (SPECSTRUCT_LINEAR=onednn, no compiler)."""
    from accelerate import init_empty_weights
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM

    config = config if config is not None else gguf_config(path)
    tensors = read_tensors(path)
    names = {t.name for t in tensors}
    if "output.weight" in names and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # the file ships its own LM head: use it, as llama.cpp does
    config.dtype = torch.float32
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary frequencies) real
        model: torch.nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32)
    lm = cast(_CausalLM, model)
    processor = _processor(config)
    mapping = _gguf_names(model)
    modules = dict(model.named_modules())
    quantized: dict[str, Tensor] = {}
    halves: dict[str, Tensor] = {}
    keep_halves = half_linear.available()
    for tensor in tensors:
        hf = mapping.get(tensor.name)
        if hf is None:
            continue
        owner, _, attr = hf.rpartition(".")
        module = modules.get(owner)
        if attr == "weight" and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            if tuple(module.weight.shape) != tuple(tensor.shape):
                raise ValueError(f"{path.name}: {tensor.name} is {list(tensor.shape)}, the model's {hf} is "
                                 f"{list(module.weight.shape)}: the file and the config disagree")
            if tensor.kind in DECODERS:
                quantized[owner] = tensor
                continue
            if tensor.kind in half_linear.DTYPES and keep_halves:
                halves[owner] = tensor
                continue
            view = _float32_view(processor, tensor, mapping) if isinstance(module, torch.nn.Linear) else None
            if view is not None:  # the runtime packs it from the file (no float copy in between)
                _set(model, hf, view)
                continue
            if tensor.kind not in ("F32", "F16", "BF16"):
                raise ValueError(f"{path.name}: tensor {tensor.name} is {tensor.kind}, a format the block-quantized "
                                 f"kernel does not compute (it computes {', '.join(DECODERS)}). Fix: re-quantize the "
                                 f"file into one of those (llama-quantize --allow-requantize IN OUT Q4_K_M), or load "
                                 f"it with weights='float32' (every weight widened to float32)")
        weights = dequantize(tensor.data, GGMLQuantizationType[tensor.kind]).reshape(tensor.shape)
        weights = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=mapping,
                                    parsed_parameters={"config": processor.config, "tensors": {}}).weights
        _set(model, hf, torch.from_numpy(np.array(weights, dtype=np.float32)))
        _release(tensor)
    for owner, tensor in [*quantized.items(), *halves.items()]:
        module = modules[owner]
        rows, cols = tensor.shape
        data = tensor.data
        order = _row_order(processor, tensor.name, rows, mapping)
        if order is not None:
            data = data[order]
        weight = (HalfWeight.from_gguf(tensor.kind, data, rows, cols) if tensor.kind in half_linear.DTYPES
                  else from_gguf_blocks(tensor.kind, data, rows, cols))
        _set(model, owner, _runtime_module(module, weight, path, owner))
        _release(tensor)
    head = lm.get_output_embeddings()
    if "output.weight" not in names and head is not None and not isinstance(head, (QuantLinear, HalfLinear)):
        embedding = lm.get_input_embeddings()  # tied: the LM head computes on the embedding's weights
        if isinstance(embedding, QuantEmbedding):
            _set(model, _name_of(model, head), QuantLinear(embedding.qweight))
        elif isinstance(embedding, HalfEmbedding):
            _set(model, _name_of(model, head), HalfLinear(embedding.hweight))
        else:
            head.weight = embedding.weight
    apply_rope_freqs(model, tensors)
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ValueError(f"{path.name} has no tensor for {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    trim_heap()  # the decoders' chunks were freed in pieces glibc keeps: ~250 MiB for the 1.5B target
    return model.eval()


def apply_rope_freqs(model: torch.nn.Module, tensors: list[Tensor]) -> None:
    """Llama 3's rotary scaling as its GGUF file ships it: llama.cpp's converter writes no rope-scaling keys, only
    `rope_freqs.weight`, a divisor per rotary frequency (ggml_rope_ext's freq_factors). The rotary embedding's
    frequencies are divided by them, as llama.cpp does, unless the config already scales them itself (a config.json
    beside the file naming the "llama3" rope type). A file without the tensor: nothing to do."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    found = next((t for t in tensors if t.name == "rope_freqs.weight"), None)
    if found is None:
        return
    factors = dequantize(found.data, GGMLQuantizationType[found.kind]).reshape(-1)
    if rope_types(config_of(model)) != {"default"}:
        return
    try:
        rotary = model.get_submodule("model.rotary_emb")
    except AttributeError:
        raise ValueError("the file has rope_freqs.weight, the model no rotary embedding at model.rotary_emb") from None
    buffers = dict(rotary.named_buffers(recurse=False))  # inv_freq, and original_inv_freq (dynamic rope's start)
    inv_freq = buffers.get("inv_freq")
    if inv_freq is None or inv_freq.shape != (len(factors),):
        raise ValueError(f"rope_freqs.weight has {len(factors)} factors, the rotary embedding "
                         f"{None if inv_freq is None else tuple(inv_freq.shape)} frequencies")
    divisors = torch.from_numpy(np.array(factors, dtype=np.float32)).to(inv_freq.device)
    for name in ("inv_freq", "original_inv_freq"):
        if name in buffers:
            setattr(rotary, name, buffers[name] / divisors)


class _CausalLM(Protocol):
    """What the loader reads of transformers' causal-LM model (its methods are untyped there)."""

    def get_output_embeddings(self) -> torch.nn.Module | None: ...
    def get_input_embeddings(self) -> torch.nn.Module: ...


def _runtime_module(module: torch.nn.Module, weight: HalfWeight | QuantWeight, path: Path,
                    owner: str) -> torch.nn.Module:
    """The runtime's module for transformers' Linear or Embedding `module` (`owner` in the model of file `path`) on
    `weight` (16-bit or block-quantized)."""
    if isinstance(module, torch.nn.Embedding):
        scale = getattr(module, "embed_scale", None)
        if isinstance(weight, HalfWeight):
            return HalfEmbedding(weight, scale, module.padding_idx)
        return QuantEmbedding(weight, scale, module.padding_idx)
    bias = module.bias if isinstance(module, torch.nn.Linear) else None
    if bias is not None and bias.device.type == "meta":
        raise ValueError(f"{path.name} has no bias for {owner} (the model's config expects one)")
    return HalfLinear(weight, bias) if isinstance(weight, HalfWeight) else QuantLinear(weight, bias)


def _name_of(model: torch.nn.Module, module: torch.nn.Module) -> str:
    name: str = next(n for n, m in model.named_modules() if m is module)
    return name


WEIGHTS = ("auto", "gguf", "q8_0", "float32")


def quantize_linears(model: torch.nn.Module, name: str = "q8_0") -> torch.nn.Module:
    """Replace every float nn.Linear by a QuantLinear of its weights rounded to `name` (in place)."""
    from specstruct.runtime.quantized import quantize_float

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, child_name, QuantLinear(quantize_float(child.weight, name), child.bias))
    return model


def load_model(name_or_path: str | os.PathLike[str], *, weights: str = "auto", device: str = "cpu",
               dtype: torch.dtype | None = None, tokenizer: object = None) -> tuple[torch.nn.Module, object]:
    """`(model, tokenizer)` with the weights asked for (`tokenizer`: one already loaded from the same files, used
    instead of building another: models.loading.same_tokenizer_files):

    - "auto": a GGUF file (or a pulled registry model) keeps its quantized blocks on the CPU; anything else loads
      as it ships (float32 by default)
    - "gguf": the quantized blocks, or an error where the source has no GGUF file
    - "q8_0": float weights rounded to Q8_0 blocks on load (a hub or folder model in a quarter of the memory)
    - "float32": every weight de-quantized to float32 (the float32 runtime)"""
    from specstruct.errors import ModelNotFoundError
    from specstruct.models.loading import gguf_file, load, load_tokenizer, resolve

    from specstruct.runtime.quantized import why_not

    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: use one of {', '.join(WEIGHTS)}")
    source = resolve(name_or_path)
    path = gguf_file(source)
    if weights == "auto" and path is not None and why_not():
        log.warning("specstruct: %s; loading %s in float32", why_not(), name_or_path)
        weights = "float32"
    if weights in ("auto", "gguf") and path is not None and str(device) == "cpu":
        config = None
        if isinstance(source, Path) and source.is_dir() and (source / "config.json").is_file():
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(source))
        if tokenizer is None:
            tokenizer = load_tokenizer(name_or_path)
        return load_quantized(path, config), tokenizer
    if weights == "gguf":
        raise ModelNotFoundError(f"weights='gguf' needs a GGUF file on the CPU; {name_or_path!r} has none"
                                 + ("" if str(device) == "cpu" else f" (device {device})")
                                 + ". Fix: point at a .gguf file, or `specstruct pull --force NAME` for a registry "
                                   "model pulled before pulls kept the GGUF file")
    model, tokenizer = load(name_or_path, device=device, dtype=dtype, tokenizer=tokenizer)
    if path is not None:  # transformers' GGUF loader reads no rope_freqs either
        apply_rope_freqs(model, read_tensors(path))
    if weights == "q8_0":
        quantize_linears(model, "q8_0")
    return model, tokenizer
