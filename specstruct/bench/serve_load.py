"""Load test of a running OpenAI-compatible server (vLLM `bench serve` vocabulary): streamed chat requests at a
fixed concurrency, optionally with Poisson arrivals at a request rate, timed per request:

- TTFT: request sent -> first content chunk; e2e: request sent -> `[DONE]`;
- TPOT: (e2e - TTFT) / (output tokens - 1); ITL: gaps between content chunks (several tokens may share one);
- throughput: output tokens and requests per second over the level's wall time;
- errors (non-200, error events, broken streams), outputs cut at max_tokens (`finish_reason: length`: an
  unfinished document, not a constraint failure) and invalid outputs (a finished text that fails its schema)."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence


@dataclass
class Job:
    """One request body and the check its output must pass (`validate(text) -> (ok | None, message)`)."""

    body: dict[str, Any]
    validate: Callable[[str], tuple[bool | None, str]]


@dataclass
class Sample:
    ok: bool = False
    valid: bool | None = None
    cut: bool = False  # finish_reason "length": stopped by max_tokens before the output was complete
    error: str = ""
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    itl: list[float] = field(default_factory=list)

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


async def one_request(client: Any, url: str, job: Job, headers: dict[str, str]) -> Sample:
    body = {**job.body, "stream": True, "stream_options": {"include_usage": True}}
    s, text, last = Sample(), [], None
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                s.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return s
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    s.e2e = time.perf_counter() - start
                    break
                data = json.loads(line[6:])
                if "error" in data:
                    s.error = data["error"].get("message", "error event")
                    return s
                if data.get("usage"):
                    s.output_tokens = data["usage"]["completion_tokens"]
                for choice in data.get("choices", []):
                    s.cut = s.cut or choice.get("finish_reason") == "length"
                    piece = choice.get("delta", {}).get("content") or choice.get("text") or ""
                    if piece:
                        now = time.perf_counter()
                        if s.ttft is None:
                            s.ttft = now - start
                        elif last is not None:
                            s.itl.append(now - last)
                        last = now
                        text.append(piece)
    except Exception as exc:  # noqa: BLE001 - a broken connection is an error sample, not a crash
        s.error = f"{type(exc).__name__}: {exc}"
        return s
    if s.e2e is None:
        s.error = "the stream ended without [DONE]"
        return s
    s.ok = True
    s.valid, _ = job.validate("".join(text))
    return s


async def run_level(base_url: str, jobs: Sequence[Job], concurrency: int, requests: int, rate: float | None,
                    api_key: str | None, seed: int = 0, on_done: Callable[[], None] | None = None) -> dict[str, Any]:
    """`requests` requests (cycling through `jobs`), at most `concurrency` in flight; with `rate`, arrivals are a
    Poisson process of that many requests per second."""
    import httpx

    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    gate, rng = asyncio.Semaphore(concurrency), random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:

        async def send(i: int) -> Sample:
            async with gate:
                sample = await one_request(client, url, jobs[i % len(jobs)], headers)
            if on_done is not None:
                on_done()
            return sample

        started = time.perf_counter()
        tasks = []
        for i in range(requests):
            tasks.append(asyncio.create_task(send(i)))
            if rate:
                await asyncio.sleep(rng.expovariate(rate))
        samples = await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    return summarise(samples, wall, concurrency, rate)


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]

    return {"p50": q(50), "p95": q(95), "p99": q(99), "mean": statistics.fmean(ordered)}


def summarise(samples: Sequence[Sample], wall: float, concurrency: int, rate: float | None) -> dict[str, Any]:
    good = [s for s in samples if s.ok]
    tokens = sum(s.output_tokens for s in good)
    return {
        "concurrency": concurrency, "rate": rate, "requests": len(samples), "wall_s": wall,
        "errors": sum(not s.ok for s in samples), "cut": sum(s.cut for s in good),
        "invalid": sum(s.valid is False and not s.cut for s in good),
        "output_tokens": tokens, "tokens_per_s": tokens / wall if wall else 0.0,
        "requests_per_s": len(good) / wall if wall else 0.0,
        "ttft_s": _pct([s.ttft for s in good if s.ttft is not None]),
        "tpot_s": _pct([s.tpot for s in good if s.tpot is not None]),
        "itl_s": _pct([x for s in good for x in s.itl]),
        "e2e_s": _pct([s.e2e for s in good if s.e2e is not None]),
        "error_messages": sorted({s.error for s in samples if s.error})[:5],
        "samples": [asdict(s) for s in samples],
    }
