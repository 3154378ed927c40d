"""A bare GGUF file is enough: its config, tokenizer and chat template come from the file's own metadata, as
llama.cpp reads them.

transformers converts GGUF metadata into a config and a fast tokenizer (`from_pretrained(folder, gguf_file=name)`),
but building a 151k-token tokenizer that way takes 20-40 s. `metadata_folder(path)` does it once per file and keeps
the result -- config.json (completed with what transformers' conversion leaves out: gguf_hparams),
generation_config.json, tokenizer files and the chat template (the file's `tokenizer.chat_template`) -- under
`$SPECSTRUCT_CACHE/gguf-metadata/<identity>/`, keyed by a digest of the file's
header (gguf_header.identity: metadata and tensor directory, and the size), so a second load, or a copy of the
file elsewhere, reads it from there in about a second. The weights are never copied: they stay in the file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from specstruct.models.gguf_header import identity, read_header
from specstruct.models.gguf_hparams import hparams
from specstruct.settings import settings

log = logging.getLogger(__name__)
MARKER = ".specstruct-metadata"  # written last: its presence means the folder is complete
VERSION = 3  # of the conversion (3: YaRN read): a folder an older one wrote is converted again


def cache_root() -> Path:
    """`$SPECSTRUCT_CACHE/gguf-metadata`, default `~/.cache/specstruct/gguf-metadata`."""
    return settings().cache / "gguf-metadata"


def metadata_folder(path: str | os.PathLike, progress: bool = False) -> Path:
    """The folder holding GGUF file `path`'s config and tokenizer (converted from its metadata on first use)."""
    path = Path(path)
    folder = cache_root() / identity(path)
    if _current(folder):
        return folder
    header = read_header(path, ("general.architecture", "general.name"))
    arch = header.values.get("general.architecture")
    log.warning("specstruct: reading the config and tokenizer of %s from its metadata (once per file, 20-40 s)",
                path.name)
    staging = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        from specstruct.models.provisioning import convert_gguf

        try:
            convert_gguf(path, staging, progress=progress)
        except (ValueError, KeyError, NotImplementedError) as e:
            raise ValueError(f"{path.name}: transformers cannot read the config or tokenizer of this GGUF file "
                             f"(architecture {arch!r}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                             "). Fix: point at a folder with the model's config.json and tokenizer files beside "
                             "the .gguf file") from e
        config = staging / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), **hparams(path)}, indent=2))
        info = {"version": VERSION, "gguf": str(path.resolve()), "size": header.size, "architecture": arch,
                "name": header.values.get("general.name"), "converted_s": round(time.perf_counter() - t0, 1)}
        (staging / MARKER).write_text(json.dumps(info, indent=2))
        if not _current(folder):  # another process may have finished the same file meanwhile
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _current(folder: Path) -> bool:
    """A finished folder written by this version of the conversion."""
    try:
        return json.loads((folder / MARKER).read_text()).get("version") == VERSION
    except (OSError, ValueError):
        return False
