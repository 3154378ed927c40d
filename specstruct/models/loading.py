"""Resolve what a user typed (registry name, folder, .gguf file, hub id) and load `(model, tokenizer)`; check that a
draft shares the target's vocabulary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specstruct.errors import IncompatibleDraftError, ModelNotFoundError
from specstruct.models.registry import GGUF_NAME, MARKER, REGISTRY, model_dir, pull_command


def resolve(name_or_path: str | os.PathLike) -> Path | str:
    """Turn what a user typed into something `from_pretrained` can open.

    - registry name -> its converted folder (not pulled: ModelNotFoundError with the pull command)
    - an existing folder -> that folder; an existing `.gguf` file -> that file (loaded with gguf_file=)
    - anything else that looks like `owner/name` -> returned unchanged as a hub id
    """
    raw = os.fspath(name_or_path)
    if raw in REGISTRY:
        folder = model_dir(raw)
        if not (folder / MARKER).is_file():
            raise ModelNotFoundError(f"model {raw!r} is not pulled yet (looked in {folder}). Fix: {pull_command(raw)}")
        return folder
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path} is a folder but has no config.json; point at a transformers model folder")
        return path
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelNotFoundError(f"{path} is a file but not a .gguf; pass a model folder, a .gguf file or a hub id")
        return path
    if raw.count("/") == 1 and not raw.startswith((".", "/", "~")):
        return raw
    raise ModelNotFoundError(
        f"cannot find model {raw!r}: not a registry name ({', '.join(sorted(REGISTRY))}), not an existing "
        f"folder or .gguf file, and not a hub id of the form owner/name"
    )


def gguf_file(source: Path | str) -> Path | None:
    """The GGUF file a resolved source holds: the file itself, or a pulled folder's model.gguf."""
    if isinstance(source, Path):
        if source.is_file() and source.suffix == ".gguf":
            return source
        if (source / GGUF_NAME).is_file():
            return source / GGUF_NAME
    return None


def metadata_source(source: Path | str) -> Path | str:
    """Where a resolved source's config and tokenizer are read from: a bare .gguf file's converted metadata
    (bare_gguf.metadata_folder: cached per file), else the source itself (a folder, a hub id)."""
    if isinstance(source, Path) and source.is_file() and source.suffix == ".gguf":
        from specstruct.models.bare_gguf import metadata_folder

        return metadata_folder(source)
    return source


def _open_kwargs(source: Path | str, tokenizer: bool = False) -> tuple[str, dict[str, Any]]:
    path = gguf_file(source)
    if path is None or (path.parent == source and (tokenizer or (path.parent / "model.safetensors").is_file())):
        return str(source), {}  # a pulled folder keeps its own tokenizer (and float32 weights, if pulled before)
    if tokenizer:  # a bare .gguf file: its tokenizer as converted once from its metadata
        return str(metadata_source(source)), {}
    return str(path.parent), {"gguf_file": path.name}


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer of a model (cheap: no weights are read)."""
    from transformers import AutoTokenizer

    source = resolve(name_or_path)
    where, kw = _open_kwargs(source, tokenizer=True)
    with _offline_errors(name_or_path, source):
        return AutoTokenizer.from_pretrained(where, **kw)


# The files a tokenizer's vocabulary, merges and added or special tokens are read from (a chat template may differ
# between two models whose tokenizers are otherwise one: a draft never uses it)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "merges.txt", "tokenizer.model")


def same_tokenizer_files(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether models `a` and `b` read their tokenizers from byte-identical files (the registry's Qwen2.5-Coder
    pair does): then one tokenizer object serves both, and a draft need not build a second one (about 170 MiB
    for a 151k-token vocabulary, left as holes in the heap once freed). A bare .gguf file's tokenizer files are its
    metadata's, as converted once (`metadata_source`). False where either has no folder of tokenizer files (a hub
    id) or cannot be opened (loading it then says why)."""
    try:
        folders = [Path(_open_kwargs(resolve(x), tokenizer=True)[0]) for x in (a, b)]
    except (OSError, ValueError, ModelNotFoundError):
        return False
    if not all(f.is_dir() for f in folders):
        return False
    names = [n for n in _TOKENIZER_FILES if any((f / n).is_file() for f in folders)]
    return bool(names) and all(all((f / n).is_file() for f in folders)
                               and (folders[0] / n).read_bytes() == (folders[1] / n).read_bytes() for n in names)


def load(name_or_path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None, tokenizer: Any = None):
    """Load `(model, tokenizer)` in eval mode (dtype default float32). Accepts every form `resolve` does.
    `tokenizer`: one already loaded from the same files (same_tokenizer_files), used instead of building another."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    source = resolve(name_or_path)
    where, kw = _open_kwargs(source)
    tok_where, tok_kw = _open_kwargs(source, tokenizer=True)
    if "gguf_file" in kw and metadata_source(source) != source:  # a bare file: its config as converted once
        kw["config"] = AutoConfig.from_pretrained(str(metadata_source(source)))
    with _offline_errors(name_or_path, source):
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(tok_where, **tok_kw)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kw)
    model = model.to(device).eval()
    return model, tokenizer


class _offline_errors:
    """Re-raise a hub/network failure as ModelNotFoundError that says what was tried."""

    def __init__(self, asked: Any, source: Path | str):
        self.asked, self.source = asked, source

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, ModelNotFoundError) or not isinstance(self.source, str):
            return False
        if isinstance(exc, (OSError, ValueError)) or "huggingface_hub" in type(exc).__module__:
            raise ModelNotFoundError(
                f"could not load {self.asked!r} as a hub id (tried the local Hugging Face cache and the hub: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Offline? Use a registry "
                f"name ({', '.join(sorted(REGISTRY))}) after `{pull_command()}`, or a local folder/.gguf file"
            ) from exc
        return False


# ---------------------------------------------------------------- draft/target compatibility

def _first_difference(a: dict[str, int], b: dict[str, int]) -> str | None:
    inv_a = {i: t for t, i in a.items()}
    inv_b = {i: t for t, i in b.items()}
    for i in sorted(set(inv_a) | set(inv_b)):
        if inv_a.get(i) != inv_b.get(i):
            return f"token id {i} is {inv_a.get(i)!r} in the target but {inv_b.get(i)!r} in the draft"
    return None


def _real_tokens(tokenizer) -> dict[str, int]:
    """A tokenizer's vocabulary less the `[PAD<id>]` tokens llama.cpp's converter pads a GGUF file's token list
    with, up to the model's rows (a bare file's tokenizer has them): padding rows, like the models' own."""
    return {t: i for t, i in tokenizer.get_vocab().items() if t != f"[PAD{i}]"}


def check_same_vocab(target_tokenizer, draft_tokenizer, target_model=None, draft_model=None) -> None:
    """Refuse a draft whose token ids mean something else than the target's: speculative verification
    compares token ids, so the vocabularies (and the models' output sizes) must be identical, padding aside."""
    fix = "Fix: use a draft from the same model family (same tokenizer), e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b, or run without a draft"
    tv, dv = _real_tokens(target_tokenizer), _real_tokens(draft_tokenizer)
    if len(tv) != len(dv):
        diff = _first_difference(tv, dv)
        raise IncompatibleDraftError(
            f"draft tokenizer has {len(dv)} tokens, target has {len(tv)}" + (f"; first difference: {diff}" if diff else "") + f". {fix}"
        )
    if tv != dv:
        raise IncompatibleDraftError(f"draft and target vocabularies differ: {_first_difference(tv, dv)}. {fix}")
    if target_model is not None and draft_model is not None:
        ts, ds = output_rows(target_model), output_rows(draft_model)
        if ts != ds and min(ts, ds) < len(tv):
            raise IncompatibleDraftError(
                f"draft model outputs {ds} logits per token, target outputs {ts}, for a {len(tv)}-token vocabulary; "
                f"they cannot be compared. {fix}")


def matched_draft(target_tokenizer, draft_tokenizer, target_model, draft_model):
    """`draft_model` once check_same_vocab passes, with its output rows made the target's when the two differ only
    in padding rows past the tokenizer (Qwen2.5-7B has 152,064 rows, 0.5B 151,936; the tokenizer 151,665 tokens):
    a resized copy of a float draft, or (a draft whose weights stay as the file ships them: no float rows to copy)
    its LM head wrapped in place (the caller passes a module of its own: runtime.owned.own) to give the target's
    number of logits. No constraint ever allows a padding id, so those rows never matter, whatever they hold."""
    check_same_vocab(target_tokenizer, draft_tokenizer, target_model, draft_model)
    rows = output_rows(target_model)
    if output_rows(draft_model) == rows:
        return draft_model
    if not hasattr(draft_model.get_input_embeddings(), "weight"):  # GGUF blocks or 16-bit panels
        from specstruct.models.padded_head import PaddedHead

        draft_model.set_output_embeddings(PaddedHead(draft_model.get_output_embeddings(), rows))
        return draft_model
    import copy

    resized = copy.deepcopy(draft_model)
    resized.resize_token_embeddings(rows, mean_resizing=False)
    return resized


def matching_draft(target_tokenizer, target_model) -> str | None:
    """The registry draft for a target of any source, chosen by vocabulary: a pulled registry draft whose
    tokenizer is the target's, whose logits are as many as the target's, and whose file is under 60% of the
    target's weights (else it would not be cheaper); None where there is none (forced text, prompt lookup and
    structure guesses still speculate)."""
    import json

    from specstruct.models.registry import REGISTRY, is_pulled, model_dir

    weights = sum(t.numel() * t.element_size() for t in (*target_model.parameters(), *target_model.buffers()))
    rows = output_rows(target_model)
    vocab = target_tokenizer.get_vocab()
    for name, spec in REGISTRY.items():
        if spec.role != "draft" or not is_pulled(name) or spec.size > 0.6 * weights:
            continue
        try:
            draft_rows = json.loads((model_dir(name) / "config.json").read_text()).get("vocab_size")
        except (OSError, ValueError):
            continue
        if draft_rows == rows and load_tokenizer(name).get_vocab() == vocab:
            return name
    return None


def output_rows(model) -> int:
    """Logits per token: the LM head's rows (its `out_features`, or its weight's rows: quantized heads expose
    `weight` as a method), else config.vocab_size."""
    emb = model.get_output_embeddings()
    if emb is None:
        return int(model.config.vocab_size)
    if isinstance(getattr(emb, "out_features", None), int):
        return emb.out_features
    weight = emb.weight
    return int((weight() if callable(weight) else weight).shape[0])
