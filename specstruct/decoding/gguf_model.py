"""A transformers model whose Linear and embedding weights stay in their GGUF block formats.

The model is transformers' own class, built from the config with its parameters on the meta device (no float32
copy is ever allocated). Each GGUF tensor is matched to its parameter by transformers' own name map
(`get_gguf_hf_weights_map`); quantized Linear and embedding weights become decoding.quantized's QuantLinear /
QuantEmbedding on the file's blocks, everything else (norms, biases, float tensors) is de-quantized and passed
through the architecture's transformers tensor processor as transformers' GGUF loader does. A processor that
reorders rows (llama's q/k permutation) is applied to the blocks as the same reordering of output rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .quantized import DECODERS, QuantEmbedding, QuantLinear, from_gguf_blocks


def gguf_config(path: Path):
    """The transformers config stored in a GGUF file's metadata."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def _processor(config):
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    arch = {"gemma3_text": "gemma3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}.get(config.model_type,
                                                                                        config.model_type)
    return TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())


def _row_order(processor, name: str, rows: int, mapping: dict) -> np.ndarray | None:
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


def _set(model: torch.nn.Module, dotted: str, value) -> None:
    parent_name, _, attr = dotted.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(value, torch.nn.Module):
        setattr(parent, attr, value)
    else:
        parent._parameters[attr] = torch.nn.Parameter(value, requires_grad=False)


def load_quantized(path: Path, config=None) -> torch.nn.Module:
    """The model of GGUF file `path` (with `config`, default the file's own) in eval mode, quantized weights kept."""
    from accelerate import init_empty_weights
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    config = config if config is not None else gguf_config(path)
    reader = GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    if "output.weight" in names and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False  # the file ships its own LM head: use it, as llama.cpp does
    config.dtype = torch.float32
    with init_empty_weights(include_buffers=False):  # parameters on meta; buffers (rotary frequencies) real
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = _processor(config)
    mapping = get_gguf_hf_weights_map(model, processor)
    modules = dict(model.named_modules())
    quantized: dict[str, tuple] = {}
    for tensor in reader.tensors:
        hf = mapping.get(tensor.name)
        if hf is None:
            continue
        owner, _, attr = hf.rpartition(".")
        module = modules.get(owner)
        kind = tensor.tensor_type.name
        if attr == "weight" and kind in DECODERS and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            quantized[owner] = (tensor, kind)
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        weights = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=mapping,
                                    parsed_parameters={"config": processor.config, "tensors": {}}).weights
        _set(model, hf, torch.from_numpy(np.array(weights, dtype=np.float32)))
    for owner, (tensor, kind) in quantized.items():
        module = modules[owner]
        rows, cols = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists dimensions innermost first
        data = np.asarray(tensor.data).reshape(rows, -1)
        order = _row_order(processor, tensor.name, rows, mapping)
        if order is not None:
            data = data[order]
        weight = from_gguf_blocks(kind, data, rows, cols)
        if isinstance(module, torch.nn.Embedding):
            _set(model, owner, QuantEmbedding(weight, getattr(module, "embed_scale", None), module.padding_idx))
        else:
            bias = module.bias if module.bias is not None and module.bias.device.type != "meta" else None
            _set(model, owner, QuantLinear(weight, bias))
    if "output.weight" not in names and isinstance(model.get_input_embeddings(), QuantEmbedding):
        head = model.get_output_embeddings()  # tied: the LM head computes on the embedding's blocks
        if head is not None and not isinstance(head, QuantLinear):
            embedding = model.get_input_embeddings()
            _set(model, _name_of(model, head), QuantLinear(embedding.qweight))
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ValueError(f"{path.name} has no tensor for {', '.join(missing[:5])}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    return model.eval()


def _name_of(model: torch.nn.Module, module: torch.nn.Module) -> str:
    return next(n for n, m in model.named_modules() if m is module)


WEIGHTS = ("auto", "gguf", "q8_0", "float32")


def gguf_file(source) -> Path | None:
    """The GGUF file a resolved source holds: the file itself, or a pulled folder's model.gguf."""
    if isinstance(source, Path):
        if source.is_file() and source.suffix == ".gguf":
            return source
        if (source / "model.gguf").is_file():
            return source / "model.gguf"
    return None


def quantize_linears(model: torch.nn.Module, name: str = "q8_0") -> torch.nn.Module:
    """Replace every float nn.Linear by a QuantLinear of its weights rounded to `name` (in place)."""
    from .quantized import quantize_float

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, child_name, QuantLinear(quantize_float(child.weight, name), child.bias))
    return model


def load_model(name_or_path, *, weights: str = "auto", device: str = "cpu", dtype=None):
    """`(model, tokenizer)` with the weights asked for:

    - "auto": a GGUF file (or a pulled registry model) keeps its quantized blocks on the CPU; anything else loads
      as it ships (float32 by default)
    - "gguf": the quantized blocks, or an error where the source has no GGUF file
    - "q8_0": float weights rounded to Q8_0 blocks on load (a hub or folder model in a quarter of the memory)
    - "float32": every weight de-quantized to float32 (the float32 runtime)"""
    from specstruct.errors import ModelNotFoundError
    from specstruct.models.loading import load, load_tokenizer, resolve

    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: use one of {', '.join(WEIGHTS)}")
    source = resolve(name_or_path)
    path = gguf_file(source)
    if weights in ("auto", "gguf") and path is not None and str(device) == "cpu":
        config = None
        if isinstance(source, Path) and source.is_dir() and (source / "config.json").is_file():
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(source))
        tokenizer = load_tokenizer(name_or_path)
        return load_quantized(path, config), tokenizer
    if weights == "gguf":
        raise ModelNotFoundError(f"weights='gguf' needs a GGUF file on the CPU; {name_or_path!r} has none"
                                 + ("" if str(device) == "cpu" else f" (device {device})"))
    model, tokenizer = load(name_or_path, device=device, dtype=dtype)
    if weights == "q8_0":
        quantize_linears(model, "q8_0")
    return model, tokenizer
