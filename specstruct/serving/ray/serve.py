"""Serving replicas on Ray Serve: each replica holds one engine and serves the OpenAI-compatible FastAPI app of
specstruct.serving.openai as its ingress, so clients see one endpoint however many replicas run.

    from ray import serve
    from specstruct.serving.ray import build_app

    serve.run(build_app("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", replicas=4, num_cpus=8))
    # -> http://127.0.0.1:8000/v1 for the openai client; streaming passes through the Serve proxy

Importing this module imports ray (the [ray] extra).
"""

from __future__ import annotations

from typing import Any, Callable

from ray import serve

from specstruct.serving.ray.engines import Pretrained, check_engine, engine_factory, model_name

DEFAULT_MAX_BATCH_SIZE = 8


@serve.ingress()
class SpecStructReplica:
    """One Serve replica: loads the engine once (in `__init__`), then serves `create_app(engine)`; Ray calls
    `check_health` every `health_check_period_s` and replaces a replica that raises."""

    def __init__(self, factory: Callable[[], Any], served_model_name: str, api_key: str | None, limits: Any):
        from specstruct.serving.openai import create_app

        self.engine = factory()
        self._app = create_app(self.engine, served_model_name=served_model_name, api_key=api_key, limits=limits)

    def __serve_build_asgi_app__(self):
        return self._app

    def check_health(self) -> None:
        check_engine(self.engine)


def replica_limits(limits: Any, max_batch_size: int, max_ongoing_requests: int | None) -> tuple[Any, int]:
    """(the app's limits, the replica's max_ongoing_requests). By default a replica takes one batch decoding plus
    one batch waiting (2 x max_batch_size); Ray holds the rest in its queue and routes each to the replica that
    frees first. The app's own admission limit is set to the same number, so a replica never answers 429 while
    Ray believes it has room."""
    from dataclasses import replace

    from specstruct.serving.openai import ServerLimits

    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
    if max_ongoing_requests is not None and max_ongoing_requests < 1:  # Ray's own rule (0 is not "unset")
        raise ValueError(f"max_ongoing_requests must be at least 1, got {max_ongoing_requests}")
    ongoing = 2 * max_batch_size if max_ongoing_requests is None else max_ongoing_requests
    return replace(limits or ServerLimits(), max_queued_requests=ongoing), ongoing


def build_app(model: str | Callable[[], Any], *, draft: str | None = None, config: dict[str, Any] | None = None,
              served_model_name: str | None = None, api_key: str | None = None, limits: Any = None,
              replicas: int = 1, num_cpus: float | None = 1, num_gpus: float | None = None,
              max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_ongoing_requests: int | None = None,
              max_queued_requests: int = -1, autoscaling_config: dict[str, Any] | None = None,
              health_check_period_s: float = 10.0, health_check_timeout_s: float = 30.0,
              name: str = "specstruct", **deployment_options: Any) -> "serve.Application":
    """A Ray Serve application (pass it to `serve.run`) of `replicas` copies of the OpenAI-compatible server.

    model        registry name, folder or hub id loaded on every replica (with draft= and SpecConfig keys in
                 config=), or a picklable engine factory
    served_model_name, api_key, limits   as in `specstruct.serving.openai.create_app`
    replicas     fixed number of replicas; or pass autoscaling_config={"min_replicas": 1, "max_replicas": 8, ...}
                 (Ray's keys; target_ongoing_requests defaults to max_batch_size)
    num_cpus, num_gpus  per replica (ray_actor_options)
    max_batch_size  rows one replica's engine decodes together (BatchConfig, when the engine batches)
    max_ongoing_requests  requests Ray sends one replica at once (default 2 x max_batch_size; the app's own
                 queue limit is set to match)
    max_queued_requests  requests Ray holds for the deployment beyond that before answering 503 (-1: no limit)
    deployment_options  any other `serve.deployment` option (e.g. request_router_config)
    """
    factory = engine_factory(model, draft, config)
    if isinstance(factory, Pretrained):
        factory = Pretrained(factory.model, factory.draft, factory.config,
                             {"max_batch_size": max_batch_size, **factory.batch})
    app_limits, ongoing = replica_limits(limits, max_batch_size, max_ongoing_requests)
    actor_options = dict(deployment_options.pop("ray_actor_options", {}))
    if num_cpus is not None:
        actor_options["num_cpus"] = num_cpus
    if num_gpus:
        actor_options["num_gpus"] = num_gpus
    options: dict[str, Any] = dict(name=name, max_ongoing_requests=ongoing, max_queued_requests=max_queued_requests,
                                   ray_actor_options=actor_options, health_check_period_s=health_check_period_s,
                                   health_check_timeout_s=health_check_timeout_s, **deployment_options)
    if autoscaling_config is not None:
        if replicas != 1:  # as Ray's deployment.options() refuses num_replicas with autoscaling_config
            raise ValueError(f"replicas={replicas} with autoscaling_config: set min_replicas/max_replicas there")
        options["autoscaling_config"] = {"target_ongoing_requests": max_batch_size, **autoscaling_config}
    else:
        options["num_replicas"] = replicas
    deployment = serve.deployment(SpecStructReplica).options(**options)
    return deployment.bind(factory, served_model_name or model_name(factory), api_key, app_limits)


_INT_ARGS, _FLOAT_ARGS = ("replicas", "max_batch_size", "max_ongoing_requests", "max_queued_requests"), \
    ("num_cpus", "num_gpus")


def app_builder(args: dict[str, Any]) -> "serve.Application":
    """`build_app` from string arguments, for Ray's own launchers:

        serve run specstruct.serving.ray.serve:app_builder model=qwen2.5-coder-1.5b draft=qwen2.5-coder-0.5b replicas=2

    and a Serve config file or KubeRay RayService `serveConfigV2` (import_path: specstruct.serving.ray.serve:app_builder,
    args: {model: ..., replicas: ...}). Keys: build_app's keyword arguments; numbers may be given as strings."""
    kwargs = dict(args)
    if "model" not in kwargs:
        raise ValueError("app_builder needs model=<registry name, folder or hub id>")
    for keys, kind in ((_INT_ARGS, int), (_FLOAT_ARGS, float)):
        for key in (k for k in keys if k in kwargs):
            try:
                kwargs[key] = kind(kwargs[key])
            except (TypeError, ValueError):
                raise ValueError(f"app_builder: {key}={kwargs[key]!r} is not a number") from None
    return build_app(kwargs.pop("model"), **kwargs)


def serve_until_interrupted(app: Any, *, host: str, port: int, name: str = "specstruct",
                            announce: Callable[[str], None] = print, timeout_s: float = 900.0) -> None:
    """`specstruct serve --ray`: run `app` on the cluster (RAY_ADDRESS, else a local one) behind Serve's HTTP proxy
    on host:port, announce the URL once every replica is up, and shut the app down on Ctrl-C/SIGTERM."""
    import signal
    import time

    import ray

    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/", blocking=False)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    deadline = time.monotonic() + timeout_s
    try:
        while (status := serve.status().applications.get(name)) is None or status.status != "RUNNING":
            if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
                raise RuntimeError(f"the Ray Serve app failed to start: {status.message or status.status}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replicas were not up after {timeout_s:.0f} s (status {status})")
            time.sleep(1)
        announce(f"specstruct: serving on Ray at http://{host}:{port}/v1; Ctrl-C to stop")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(name)
