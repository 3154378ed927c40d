"""`specstruct serve` as a user runs it: a subprocess on a tiny model folder, the URL printed when ready, and a
clean stop on SIGTERM / SIGINT while requests are running (never a hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from specstruct.testing import tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tok = tiny_tokenizer()
    tiny_model(tok, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def start(model_dir: Path, **env_vars: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPECSTRUCT_API_KEY": "k", "OMP_NUM_THREADS": "1", **env_vars}
    proc = subprocess.Popen([sys.executable, "-m", "specstruct", "serve", "--model", str(model_dir), "--no-draft",
                             "--port", "0", "--served-model-name", "tiny", "--shutdown-timeout", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if "http://" in line:
            url = line.split("at ", 1)[1].split(" ", 1)[0].rstrip(";")
            return proc, url
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError("specstruct serve did not print its URL:\n" + "".join(lines))


def test_serve_prints_url_and_stops_cleanly_during_requests(model_dir):
    sig = signal.SIGTERM
    proc, url = start(model_dir)
    try:
        assert url.startswith("http://127.0.0.1:")
        headers = {"Authorization": "Bearer k"}
        assert httpx.get(url + "/models", headers=headers).json()["data"][0]["id"] == "tiny"
        assert httpx.get(url + "/models").status_code == 401  # SPECSTRUCT_API_KEY is honoured
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
                "stream": True, "structured_outputs": {"regex": "[ab]{2000}"}}
        got: list[str] = []

        def client() -> None:
            try:
                with httpx.stream("POST", url + "/chat/completions", json=body, headers=headers, timeout=60) as r:
                    for line in r.iter_lines():
                        got.append(line)
            except httpx.HTTPError as e:  # the server may cut the stream when it stops
                got.append(f"closed: {e!r}")

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while not any('"content":"' in line for line in got) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any('"content":"' in line for line in got), got[:5]
        stopped_at = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == -sig  # uvicorn re-raises the signal once it has shut down
        assert time.monotonic() - stopped_at < 20
        rest = proc.stdout.read()
        assert "specstruct: stopped" in rest and "Traceback" not in rest, rest
        for t in threads:
            t.join(10)
            assert not t.is_alive()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_port_in_use_is_a_usage_error_before_the_model_loads(tmp_path):
    """It used to load the model, then exit 3 (uvicorn's startup failure, "constraint error" in specstruct's table)."""
    import socket

    from typer.testing import CliRunner

    from specstruct.cli import commands as cli

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(cli.app, ["serve", "--model", str(tmp_path / "no-model"), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port}" in result.output and "--port" in result.output
