"""Soak test of a running OpenAI-compatible server: many concurrent streams for minutes, with clients that hang up
mid-reply and hostile requests mixed in, while a monitor times /health and samples the server's resident memory.

What a healthy server shows (and `verdict` checks): no 5xx and no broken stream on any request, every finished
normal reply valid, every hostile request answered (a 4xx naming the problem, or a valid reply) before its
deadline, /health answering within 2 s throughout, and resident memory at the end within 10% of its level after
warm-up (memory a hostile burst took comes back)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from specstruct.bench.serve_load import Job, _pct, one_request

HEALTH_LIMIT_S = 2.0
RSS_TOLERANCE = 0.10


@dataclass(frozen=True)
class Raw:
    """A hostile request no JSON encoder writes: `body` sent as it is, with `header_bytes` of padding in one header
    (a header flood, sent on a raw connection: the server may close it before the head is whole)."""

    body: bytes
    header_bytes: int = 0


HUGE_INT = "9" * 5000  # past the 4300 digits Python reads into an int


def hostile_bodies(model: str) -> dict[str, dict[str, Any] | Raw]:
    """Requests a hostile client sends, by name: each must end in a 4xx (or a valid reply), never a stall or a 5xx."""
    chat = [{"role": "user", "content": "Answer."}]

    def body(**extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": chat, "max_tokens": 64, "temperature": 0, **extra}

    def raw(text: str, **extra: Any) -> Raw:  # `text` replaces the string "@" in the body
        return Raw(json.dumps(body(**extra)).replace('"@"', text).encode())

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}} for i in range(1500)]
    return {
        "grammar-loop": body(max_tokens=350, structured_outputs={"grammar": "start: P A A\nP: /[xy]{300}/\nA: /b+/"}),
        "backtracking-pattern": body(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "string", "pattern": "^(?:(a|aa)+b)?a{42}$", "maxLength": 42}}}),
        "huge-grammar": body(structured_outputs={"grammar": "start: " + " | ".join(f'"w{i}"' for i in range(200_000))}),
        "many-stops": body(stop=[f"s{i}" for i in range(200_000)]),
        "many-tools": body(tools=tools),
        "surrogate-property": body(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "properties": {"\ud800": {"type": "integer"}}, "required": ["\ud800"]}}}),
        "bad-regex": body(structured_outputs={"regex": "(unclosed"}),
        "header-flood": Raw(json.dumps(body(max_tokens=2)).encode(), header_bytes=128 << 20),
        "huge-int-max-tokens": raw(HUGE_INT, max_tokens="@"),
        "huge-int-seed": raw(HUGE_INT, seed="@"),
        "huge-int-unknown-field": raw(HUGE_INT, an_unknown_field=["@"]),
        "huge-int-schema-maximum": raw(HUGE_INT, response_format={"type": "json_schema", "json_schema": {
            "name": "s", "schema": {"type": "integer", "maximum": "@"}}}),
        "nan-temperature": raw("NaN", temperature="@"),
        "negative-seed": body(seed=-1),
        "slow-grammar-compile": body(structured_outputs={"grammar": "start: " + " | ".join(
            f'"w{i}x"' for i in range(20_000))}),
        "hostile-tool-schemas": body(tools=[{"type": "function", "function": {"name": f"t{i}", "parameters": {
            "type": "object", "properties": {f"p{k}": {"type": "string", "pattern": "^(?:(a|aa)+b)?a{42}$"}
                                             for k in range(i * 50)}}}} for i in range(1, 5)],
            tool_choice="required"),
    }


@dataclass
class Tally:
    """What one kind of request got: HTTP statuses, failures, latencies."""

    sent: int = 0
    status: dict[str, int] = field(default_factory=dict)
    broken: int = 0  # connection errors and streams cut without [DONE] (not counting our own hang-ups)
    invalid: int = 0
    slowest_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def count(self, status: int | str, seconds: float, error: str = "") -> None:
        self.sent += 1
        key = str(status)
        self.status[key] = self.status.get(key, 0) + 1
        self.slowest_s = max(self.slowest_s, seconds)
        self.latencies.append(seconds)
        if error and len(self.errors) < 5 and error not in self.errors:
            self.errors.append(error[:300])

    def fivexx(self) -> int:
        return sum(n for s, n in self.status.items() if s.startswith("5"))

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "status": dict(sorted(self.status.items())), "5xx": self.fivexx(),
                "broken": self.broken, "invalid": self.invalid, "slowest_s": round(self.slowest_s, 3),
                "latency_s": _pct(self.latencies), "errors": self.errors}


def rss_mb(pid: int) -> float | None:
    """Resident memory of a process on this machine, in MiB (Linux /proc), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


async def _hostile(client: Any, url: str, headers: dict[str, str], body: dict[str, Any] | Raw, tally: Tally,
                   deadline_s: float) -> None:
    start = time.perf_counter()
    try:
        if isinstance(body, Raw) and body.header_bytes:
            status, text = await asyncio.wait_for(_flood(url, headers, body), deadline_s)
            tally.count(status, time.perf_counter() - start, "" if status < 400 else text[:300])
            return
        # ASCII escapes: a lone surrogate travels as \ud800, as a client sends it
        data = body.body if isinstance(body, Raw) else json.dumps(body).encode()
        resp = await client.post(url, content=data, headers={**headers, "Content-Type": "application/json"},
                                 timeout=deadline_s)
        seconds = time.perf_counter() - start
        tally.count(resp.status_code, seconds, "" if resp.status_code < 400 else resp.text[:300])
        if len(resp.content) > 16_384:
            tally.errors.append(f"error body of {len(resp.content)} bytes")
    except Exception as exc:  # noqa: BLE001 - a timeout or a dropped connection is what the soak looks for
        tally.broken += 1
        tally.count("timeout" if "Timeout" in type(exc).__name__ else "error", time.perf_counter() - start,
                    f"{type(exc).__name__}: {exc}")


async def _flood(url: str, headers: dict[str, str], raw: Raw) -> tuple[int, str]:
    """POST `raw` with `raw.header_bytes` of padding in one header, on a connection of its own; (status, reply).
    The head is written in 1 MB pieces while the reply is read: a server that refuses it early answers early."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
             f"Content-Length: {len(raw.body)}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]

    async def send() -> None:
        try:
            writer.write(("\r\n".join(lines) + "\r\nX-Flood: ").encode())
            piece, left = b"a" * (1 << 20), raw.header_bytes
            while left > 0:
                writer.write(piece[:left])
                await writer.drain()
                left -= len(piece)
            writer.write(b"\r\n\r\n" + raw.body)
            await writer.drain()
        except OSError:  # the server closed the connection: its answer is read below
            pass

    sender = asyncio.create_task(send())
    try:
        reply = await reader.read(65536)
        while reply and b"\r\n\r\n" not in reply:
            more = await reader.read(65536)
            if not more:
                break
            reply += more
    except OSError as exc:
        reply = b"HTTP/1.1 000 " + str(exc).encode()
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
    head, _, rest = reply.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/") else b"0"
    if not status.isdigit() or status == b"000":
        raise ConnectionError(f"no HTTP reply to a header flood: {reply[:200]!r}")
    return int(status), rest.decode("utf-8", "replace")


async def _hang_up(client: Any, url: str, headers: dict[str, str], job: Job, tally: Tally, after_s: float) -> None:
    """A streamed request whose client goes away after `after_s` seconds (or at the first chunk, if later)."""
    start = time.perf_counter()
    body = {**job.body, "stream": True}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            async for _ in resp.aiter_lines():
                if time.perf_counter() - start >= after_s:
                    break
            tally.count(resp.status_code, time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001
        tally.broken += 1
        tally.count("error", time.perf_counter() - start, f"{type(exc).__name__}: {exc}")


async def _normal(client: Any, url: str, headers: dict[str, str], job: Job, tally: Tally) -> None:
    sample = await one_request(client, url, job, headers)
    status = 200 if sample.ok else (sample.error.split()[1].rstrip(":") if sample.error.startswith("HTTP ") else "error")
    if not sample.ok and status == "error":
        tally.broken += 1
    tally.count(status, sample.e2e if sample.e2e is not None else 0.0, sample.error)
    if sample.ok and sample.valid is False and not sample.cut:
        tally.invalid += 1


async def soak(base_url: str, jobs: Sequence[Job], *, seconds: float, streams: int = 32, api_key: str | None = None,
               hostile: dict[str, dict[str, Any] | Raw] | None = None, hostile_share: float = 0.1,
               hangup_share: float = 0.1, server_pid: int | None = None, warmup_s: float = 0.0,
               deadline_s: float = 60.0, sample_every_s: float = 2.0, seed: int = 0,
               on_tick: Callable[[float], None] | None = None) -> dict[str, Any]:
    """`streams` clients, each sending one request after another for `seconds`: a hostile one (from `hostile`,
    round-robin) with probability `hostile_share`, one it hangs up on with probability `hangup_share`, otherwise
    a normal streamed request (a job, validated). /health and the server's RSS are sampled every `sample_every_s`."""
    import httpx

    url = base_url.rstrip("/") + "/chat/completions"
    health_url = base_url.rstrip("/").removesuffix("/v1") + "/health"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    hostile = hostile or {}
    tallies = {"normal": Tally(), "hang-up": Tally(), **{f"hostile:{k}": Tally() for k in hostile}}
    timeline: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=streams + 8, max_keepalive_connections=streams + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(max(deadline_s, 600.0)), limits=limits) as client:
        started = time.perf_counter()
        stop_at = started + warmup_s + seconds

        async def client_loop(i: int) -> None:
            rng, names, n = random.Random(seed * 1000 + i), sorted(hostile), 0
            while time.perf_counter() < stop_at:
                roll, n = rng.random(), n + 1
                if names and roll < hostile_share:
                    name = names[(i + n) % len(names)]
                    await _hostile(client, url, headers, hostile[name], tallies[f"hostile:{name}"], deadline_s)
                elif roll < hostile_share + hangup_share:
                    await _hang_up(client, url, headers, jobs[rng.randrange(len(jobs))], tallies["hang-up"],
                                   rng.uniform(0.05, 2.0))
                else:
                    await _normal(client, url, headers, jobs[rng.randrange(len(jobs))], tallies["normal"])

        async def monitor() -> None:
            while True:
                t0 = time.perf_counter()
                try:
                    status = (await client.get(health_url, timeout=30.0)).status_code
                except Exception:  # noqa: BLE001
                    status = 0
                now = time.perf_counter()
                timeline.append({"t_s": round(now - started, 2), "health_s": round(now - t0, 4),
                                 "health_status": status,
                                 "rss_mb": rss_mb(server_pid) if server_pid else None})
                if on_tick is not None:
                    on_tick(now - started)
                if now >= stop_at:
                    return
                await asyncio.sleep(max(0.0, sample_every_s - (time.perf_counter() - t0)))

        watcher = asyncio.create_task(monitor())
        clients = [asyncio.create_task(client_loop(i)) for i in range(streams)]
        # a server that stopped answering must not hang the soak: what is still open a deadline after the end is
        # cancelled and counted as unfinished
        _, hung = await asyncio.wait(clients, timeout=warmup_s + seconds + deadline_s)
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
        await asyncio.wait_for(watcher, timeout=sample_every_s + 35.0)
        # once every client is done, the server should give back what the burst took
        await asyncio.sleep(sample_every_s)
        timeline.append({"t_s": round(time.perf_counter() - started, 2), "health_s": None, "health_status": None,
                         "rss_mb": rss_mb(server_pid) if server_pid else None, "after": True})
    return report(tallies, timeline, warmup_s, streams, seconds, unfinished=len(hung))


def report(tallies: dict[str, Tally], timeline: list[dict[str, Any]], warmup_s: float, streams: int,
           seconds: float, unfinished: int = 0) -> dict[str, Any]:
    healths = [t["health_s"] for t in timeline if t.get("health_s") is not None]
    rss = [(t["t_s"], t["rss_mb"]) for t in timeline if t.get("rss_mb") is not None]
    after_warmup = [m for s, m in rss if s >= warmup_s] or [m for _, m in rss]
    rss_summary = None
    if after_warmup:
        rss_summary = {"start_mb": round(after_warmup[0], 1), "max_mb": round(max(after_warmup), 1),
                       "end_mb": round(after_warmup[-1], 1),
                       "end_vs_start": round(after_warmup[-1] / after_warmup[0], 3)}
    return {"streams": streams, "seconds": seconds, "unfinished": unfinished,
            "kinds": {k: t.summary() for k, t in tallies.items()},
            "health": {"samples": len(healths), "max_s": max(healths, default=None),
                       "failed": sum(t["health_status"] not in (200, None) for t in timeline)},
            "rss": rss_summary, "timeline": timeline}


def verdict(result: dict[str, Any], deadline_s: float = 60.0) -> list[str]:
    """What the soak found wrong (empty when the server held up)."""
    problems = []
    for kind, s in result["kinds"].items():
        if s["5xx"]:
            problems.append(f"{kind}: {s['5xx']} responses with a 5xx status")
        if s["broken"] and kind != "hang-up":
            problems.append(f"{kind}: {s['broken']} broken or timed-out requests")
        if s["invalid"]:
            problems.append(f"{kind}: {s['invalid']} finished outputs that fail their schema")
        if kind.startswith("hostile:") and s["slowest_s"] > deadline_s:
            problems.append(f"{kind}: took {s['slowest_s']:.1f} s (limit {deadline_s:.0f} s)")
    if result.get("unfinished"):
        problems.append(f"{result['unfinished']} clients still waiting for a reply {deadline_s:.0f} s after the end")
    health = result["health"]
    if health["failed"] or (health["max_s"] or 0) > HEALTH_LIMIT_S:
        problems.append(f"/health: {health['failed']} failures, slowest {health['max_s']} s "
                        f"(limit {HEALTH_LIMIT_S} s)")
    rss = result["rss"]
    if rss and rss["end_vs_start"] > 1 + RSS_TOLERANCE:
        problems.append(f"RSS {rss['start_mb']} -> {rss['end_mb']} MiB after the run "
                        f"(more than {RSS_TOLERANCE:.0%} above its level after warm-up)")
    return problems


def table(result: dict[str, Any]) -> str:
    head = ("| requests | sent | statuses | 5xx | broken | invalid | p50 s | p99 s | slowest s |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    rows = []
    for kind, s in result["kinds"].items():
        lat = s["latency_s"]
        statuses = ", ".join(f"{k}: {n}" for k, n in s["status"].items()) or "-"
        rows.append(f"| {kind} | {s['sent']} | {statuses} | {s['5xx']} | {s['broken']} | {s['invalid']} | "
                    f"{fmt(lat['p50'])} | {fmt(lat['p99'])} | {s['slowest_s']:.2f} |")
    h, rss = result["health"], result["rss"]
    tail = f"\n\n/health: {h['samples']} probes, slowest {h['max_s']} s, {h['failed']} failed."
    if result.get("unfinished"):
        tail += f" {result['unfinished']} clients never got an answer (cancelled)."
    if rss:
        tail += (f" Server RSS: {rss['start_mb']} MiB after warm-up, peak {rss['max_mb']}, "
                 f"{rss['end_mb']} at the end ({rss['end_vs_start']:.2f}x).")
    return head + "\n".join(rows) + tail


def plot(result: dict[str, Any], path: str) -> None:
    """RSS and /health latency over the run, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result["timeline"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot([t["t_s"] for t in tl if t["rss_mb"]], [t["rss_mb"] for t in tl if t["rss_mb"]], marker=".")
    a.set(xlabel="seconds", ylabel="server RSS (MiB)", title="resident memory")
    b.plot([t["t_s"] for t in tl if t["health_s"] is not None], [t["health_s"] for t in tl if t["health_s"] is not None],
           marker=".")
    b.axhline(HEALTH_LIMIT_S, color="red", linestyle="--", label=f"{HEALTH_LIMIT_S:.0f} s limit")
    b.set(xlabel="seconds", ylabel="/health latency (s)", title="responsiveness")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
