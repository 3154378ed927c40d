"""`specstruct serve`: the OpenAI-compatible HTTP server (specstruct.serving.openai) under uvicorn."""

from __future__ import annotations

from typing import Any, Optional

import typer

from specstruct.cli.commands import _DRAFT, _MODEL, _NO_DRAFT, _engine
from specstruct.cli.support import EXIT_OTHER, EXIT_USAGE, errors, fail
from specstruct.settings import settings

SERVE_HELP = """Serve a model over an OpenAI-compatible HTTP API (chat completions, completions, models, health,
metrics): structured outputs and tool calls guaranteed by the grammar, sped up by speculation.

Needs the server extra:  pip install "specstruct\\[server]"

[bold]Examples[/bold]

  specstruct serve                                   # qwen2.5-coder-1.5b + its draft on 127.0.0.1:8000

  specstruct serve --model qwen2.5-coder-0.5b --no-draft --port 9000

  SPECSTRUCT_API_KEY=secret specstruct serve --host 0.0.0.0 --served-model-name coder

Then, from Python:

  client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret")

  client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=[...],
      response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {...}}})

or LangChain:  ChatOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret", model="qwen2.5-coder-1.5b")

Extra request field for what OpenAI's API cannot say:  "structured_outputs": {"regex": "..."}
(or "json", "choice", "grammar"). Stop with Ctrl-C or SIGTERM."""


def _batched_engine(model: str, draft: Optional[str], no_draft: bool, max_batch_size: int) -> Any:
    """The engine, decoding up to `max_batch_size` requests together (its scheduler's BatchConfig)."""
    return _engine(model, draft, no_draft, None, batch_config={"max_batch_size": max_batch_size})


def serve(
    model: str = _MODEL, draft: Optional[str] = _DRAFT, no_draft: bool = _NO_DRAFT,
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes it to the network."),
    port: int = typer.Option(8000, "--port", "-p", min=0, max=65535, help="TCP port (0: any free port)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' on /v1 and "
                                          "/metrics (default: env SPECSTRUCT_API_KEY)."),
    max_batch_size: int = typer.Option(8, "--max-batch-size", min=1, help="Most requests decoded together."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name",
                                                    help="The model id clients send (default: --model)."),
    max_tokens_cap: int = typer.Option(4096, "--max-tokens-cap", min=1, help="Largest max_tokens accepted."),
    default_max_tokens: int = typer.Option(512, "--default-max-tokens", min=1,
                                           help="max_tokens of a chat request that sends none."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Requests held at once; more get 429."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", min=1, help="Seconds before a request is cancelled."),
    max_header_bytes: int = typer.Option(64 * 1024, "--max-header-bytes", min=1024, help="Larger request heads "
                                         "(request line and headers) get 431 and are closed unread."),
    max_header_field_bytes: int = typer.Option(16 * 1024, "--max-header-field-bytes", min=256,
                                               help="A larger header (name and value) gets 431."),
    max_body_bytes: int = typer.Option(4 * 1024 * 1024, "--max-body-bytes", min=1024, help="Larger bodies get 413."),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", min=1,
                                                    help="Longer prompts get 400 (default: the model's window)."),
    max_stop_sequences: int = typer.Option(16, "--max-stop-sequences", min=0, help="Most stop strings a request "
                                           "sends (OpenAI: 4)."),
    max_stop_chars: int = typer.Option(4096, "--max-stop-chars", min=0, help="Most characters of all stop strings."),
    max_tools: int = typer.Option(128, "--max-tools", min=0, help="Most tools a request sends (OpenAI: 128)."),
    max_tools_bytes: int = typer.Option(256 * 1024, "--max-tools-bytes", min=0,
                                        help="Largest tool definitions of a request, in bytes of JSON."),
    max_constraint_bytes: int = typer.Option(256 * 1024, "--max-constraint-bytes", min=0, help="Largest output "
                                             "constraint (JSON schema, regex, grammar, choices) in bytes."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                          help="torch threads (default: torch's; 1 is faster on a busy machine)."),
    no_speculation: bool = typer.Option(False, "--no-speculation",
                                        help="Plain target-only decoding (for A/B measurements)."),
    shutdown_timeout: float = typer.Option(5.0, "--shutdown-timeout", min=0,
                                           help="Seconds running requests get to finish on SIGINT/SIGTERM."),
    ray: bool = typer.Option(False, "--ray", help="Serve N replicas on Ray Serve (RAY_ADDRESS, else a local "
                             "cluster); needs pip install \"specstruct\\[ray]\"."),
    replicas: int = typer.Option(1, "--replicas", min=1, help="--ray: engines behind the one endpoint."),
    num_cpus: Optional[float] = typer.Option(None, "--num-cpus", min=0, help="--ray: CPUs per replica (its torch "
                                             "threads); default 1."),
    num_gpus: Optional[float] = typer.Option(None, "--num-gpus", min=0, help="--ray: GPUs per replica."),
) -> None:
    with errors():
        api_key = settings().api_key if api_key is None else api_key
        if default_max_tokens > max_tokens_cap:
            raise fail(f"--default-max-tokens {default_max_tokens} is over --max-tokens-cap {max_tokens_cap}; lower "
                       "it or raise the cap", EXIT_USAGE)
        if ray or replicas != 1 or num_cpus is not None or num_gpus is not None:
            unused = [flag for flag, used in (("--no-speculation", no_speculation), ("--threads", threads),
                                              ("--shutdown-timeout", shutdown_timeout != 5.0)) if used]
            if unused:  # Ray Serve replicas take their threads from --num-cpus and shut down through Ray
                raise fail(f"{', '.join(unused)} does not apply with --ray (Ray sets each replica's threads from "
                           "--num-cpus and stops replicas itself); leave it out", EXIT_USAGE)
            from specstruct.cli.ray import serve_on_ray

            return serve_on_ray(**locals())
        try:
            import uvicorn

            from specstruct.serving.openai import ServerLimits, create_app
            from specstruct.serving.openai.http import uvicorn_options
        except ImportError as exc:
            raise fail(f"the server needs its extra ({exc}): pip install \"specstruct[server]\"", EXIT_OTHER) from None
        if api_key == "":
            raise fail("--api-key is empty; pass a key or leave it out", EXIT_USAGE)
        _check_address(host, port)  # before the model loads, not after
        if threads:
            import torch

            torch.set_num_threads(threads)
        engine = _batched_engine(model, draft, no_draft, max_batch_size)
        if no_speculation:
            engine.config = engine.config.merged(enable_speculative=False)
        name = served_model_name or model
        limits = ServerLimits.from_options(**locals())
        app = create_app(engine, served_model_name=name, api_key=api_key, limits=limits)
        config = uvicorn.Config(app, host=host, port=port, log_level=settings().log,
                                timeout_graceful_shutdown=shutdown_timeout, access_log=False, **uvicorn_options(limits))
        try:
            _AnnouncingServer(config, name, bool(api_key)).run()
        except SystemExit as exc:  # uvicorn exits 3 when it cannot start: that code means "constraint error" here
            if exc.code not in (0, None):
                raise fail("the server could not start (uvicorn's error above)", EXIT_OTHER) from None
            raise


def _check_address(host: str, port: int) -> None:
    """Fail fast, naming the fix, when `host:port` cannot be listened on (a port in use, an unknown host)."""
    import socket

    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
            probe.bind(address)
    except OSError as exc:
        raise fail(f"cannot listen on {host}:{port} ({exc.strerror or exc}): choose another --port (0 picks a free "
                   "one) or stop what is using it", EXIT_USAGE) from None


class _AnnouncingServer:
    """uvicorn.Server that prints the URL once it listens (the real port when --port 0) and says when it stops.
    On SIGINT/SIGTERM uvicorn stops accepting, lets running requests finish for `timeout_graceful_shutdown`
    seconds, ends the rest with a 503 "shutting_down" error (an error event and [DONE] in a stream; GracefulServer)
    and cancels their generations, then re-raises the signal, so the exit status says which signal stopped it."""

    def __new__(cls, config: Any, name: str, keyed: bool) -> Any:
        from specstruct.serving.openai.graceful import GracefulServer

        class Server(GracefulServer):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:
                    host, port = self.servers[0].sockets[0].getsockname()[:2]
                    typer.echo(f"specstruct: serving {name!r} at http://{host}:{port}/v1"
                               f"{' (API key required)' if keyed else ''}; Ctrl-C to stop", err=False)

            async def shutdown(self, sockets: Any = None) -> None:
                typer.echo("specstruct: stopping (running requests get --shutdown-timeout seconds)", err=True)
                await super().shutdown(sockets)
                typer.echo("specstruct: stopped", err=True)

        return Server(config)


serve.__doc__ = SERVE_HELP
