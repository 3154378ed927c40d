"""Ray Serve replicas behind one endpoint, answering the official `openai` client: structured output, a tool call,
streaming through the Serve proxy, the API key, and the replica limits that follow the batch size."""

from __future__ import annotations

import json
import socket
import time

import jsonschema
import pytest

openai = pytest.importorskip("openai", reason='the openai client is not installed: pip install -e ".[test]"')
serve = pytest.importorskip("ray.serve", reason='ray[serve] is not installed: pip install -e ".[ray]"')

LIGHT = {"type": "object", "required": ["on", "room"], "additionalProperties": False,
         "properties": {"on": {"type": "boolean"}, "room": {"enum": ["kitchen", "hall"]}}}
TOOLS = [{"type": "function", "function": {"name": "set_light", "description": "Switch a light", "parameters": LIGHT}}]
HI = [{"role": "user", "content": "Switch the kitchen light on."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "light", "schema": LIGHT, "strict": True}}
MODEL, KEY = "tiny", "ray-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url(ray_cluster, tiny_folders):
    """Two replicas (half a CPU each) of the tiny pair on a free port; bounded wait for RUNNING."""
    from specstruct.serving.ray import build_app

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    target, draft = tiny_folders
    app = build_app(target, draft=draft, config={"max_new_tokens": 60}, served_model_name=MODEL, api_key=KEY,
                    replicas=2, num_cpus=0.5, max_batch_size=4, health_check_period_s=2)
    serve.run(app, name="specstruct", route_prefix="/", blocking=False)
    deadline = time.monotonic() + 240
    while (status := serve.status().applications.get("specstruct")) is None or status.status != "RUNNING":
        assert time.monotonic() < deadline, f"the Serve app did not start: {status}"
        assert status is None or status.status not in ("DEPLOY_FAILED", "UNHEALTHY"), status
        time.sleep(0.5)
    yield f"http://127.0.0.1:{port}/v1"
    serve.shutdown()


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=60)


def test_structured_output_through_the_serve_proxy(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=60, response_format=FORMAT)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), LIGHT)


def test_tool_call_through_the_serve_proxy(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=120, tools=TOOLS, tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "set_light"
    jsonschema.validate(json.loads(call.function.arguments), LIGHT)


def test_streaming_passes_through_the_proxy(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=60, response_format=FORMAT,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), LIGHT)


def test_wrong_key_is_401_not_500(base_url):
    bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_replica_limits_follow_the_batch_size():
    from specstruct.serving.openai import ServerLimits
    from specstruct.serving.ray.serve import replica_limits

    limits, ongoing = replica_limits(ServerLimits(request_timeout_s=5), max_batch_size=4, max_ongoing_requests=None)
    assert ongoing == 8 and limits.max_queued_requests == 8 and limits.request_timeout_s == 5


def test_build_app_passes_autoscaling_and_resources_through(ray_cluster):
    from specstruct.serving.ray import build_app

    app = build_app(lambda: None, served_model_name="m", num_cpus=2, max_batch_size=3,
                    autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    cfg = app._bound_deployment._deployment_config
    assert cfg.max_ongoing_requests == 6
    assert cfg.autoscaling_config.max_replicas == 4 and cfg.autoscaling_config.target_ongoing_requests == 3
    assert app._bound_deployment.ray_actor_options["num_cpus"] == 2


def test_cli_replicas_without_ray_is_a_usage_error():
    from typer.testing import CliRunner

    from specstruct.cli import app

    res = CliRunner().invoke(app, ["serve", "--replicas", "2"])
    assert res.exit_code == 2 and "go with --ray" in res.output, res.output


def test_app_builder_takes_string_arguments_as_serve_run_passes_them(ray_cluster, tiny_folders):
    from specstruct.serving.ray.serve import app_builder

    app = app_builder({"model": tiny_folders[0], "replicas": "3", "num_cpus": "0.5", "max_batch_size": "2"})
    bound = app._bound_deployment
    assert bound._deployment_config.num_replicas == 3 and bound._deployment_config.max_ongoing_requests == 4
    assert bound.ray_actor_options["num_cpus"] == 0.5
