"""`specstruct serve` (a subprocess, as a user runs it) given a Lark grammar that llguidance loops on mid-output:
that request is a 400 naming the limit well within a minute, /health answers within 2 s throughout, the next
request succeeds and the server's memory stays where it was. In a subprocess because a loop that is not contained
holds the whole process: the test's own client then times out instead of hanging the test run."""

from __future__ import annotations

import threading
import time

import httpx
from test_serve_command import model_dir, start  # noqa: F401 - the fixture is used by name

LOOP = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 350,
        "structured_outputs": {"grammar": "start: P A A\nP: /[xy]{300}/\nA: /b+/"}}
NORMAL = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12,
          "structured_outputs": {"grammar": 'start: "a" "b"+ "."'}}
HEADERS = {"Authorization": "Bearer k"}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_a_looping_grammar_is_a_400_and_the_server_stays_healthy(model_dir):  # noqa: F811
    proc, url = start(model_dir, SPECSTRUCT_MASK_TIME_S="2")
    health_url = url.rsplit("/v1", 1)[0] + "/health"
    waits: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = httpx.get(health_url, timeout=5).status_code == 200
            except httpx.HTTPError:
                ok = False
            waits.append(time.monotonic() - t0 if ok else float("inf"))
            stop.wait(0.25)

    poller = threading.Thread(target=poll_health, daemon=True)
    try:
        assert httpx.post(url + "/chat/completions", json=NORMAL, headers=HEADERS, timeout=60).status_code == 200
        before = rss_mb(proc.pid)
        poller.start()
        t0 = time.monotonic()
        try:
            resp = httpx.post(url + "/chat/completions", json=LOOP, headers=HEADERS, timeout=45)
        except httpx.TimeoutException:
            raise AssertionError("the looping grammar's request never ended") from None
        took = time.monotonic() - t0
        assert resp.status_code == 400, resp.text[:2000]
        error = resp.json()["error"]
        assert error["param"] == "structured_outputs.grammar", error
        assert "mask_time_s=2.0" in error["message"] and "SPECSTRUCT_MASK_TIME_S" in error["message"], error
        assert took < 30, took
        after = httpx.post(url + "/chat/completions", json=NORMAL, headers=HEADERS, timeout=30)
        assert after.status_code == 200, after.text[:2000]
        stop.set()
        poller.join(10)
        assert len(waits) >= 4 and max(waits) < 2.0, waits
        assert rss_mb(proc.pid) < before * 1.1 + 20, (before, rss_mb(proc.pid))
    finally:
        stop.set()
        proc.kill()
        proc.wait()
