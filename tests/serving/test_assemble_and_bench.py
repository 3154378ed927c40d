"""Pieces that need no server: streamed tool-call deltas for parallel calls, their reassembly; and the
`specstruct bench serve` load generator against an in-process server."""

from __future__ import annotations

import asyncio
import json

from server_fixtures import KEY, MODEL, running, tiny_engine

import specstruct as ss
from specstruct.bench.serve_cli import table
from specstruct.bench.serve_load import Job, run_level
from specstruct.serving.openai import create_app
from specstruct.serving.openai.assemble import Assembler, merge
from specstruct.serving.openai.translate import EngineCall
from specstruct.testing import tiny_tokenizer


def call(name, args):
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_parallel_calls_stream_as_openai_deltas_and_merge_back():
    text = call("add", {"a": 1}) + "\n" + call("mood", {"happy": True}) + "\n"
    asm = Assembler(tiny_tokenizer(), EngineCall([], ss.Grammar("start: x"), [{}], {}, None, "tools"))
    deltas = []
    for i in range(0, len(text), 5):
        deltas += asm.feed(ss.Chunk(text=text[i:i + 5]))
    deltas += asm.feed(ss.Chunk(text="", result=ss.Result(text, text, [], ss.Stats())))
    deltas += asm.finish()
    assert asm.finish_reason == "tool_calls"
    assert [d["tool_calls"][0]["index"] for d in deltas] == [0, 0, 1, 1]
    first, args = deltas[0]["tool_calls"][0], deltas[1]["tool_calls"][0]
    assert first["type"] == "function" and first["function"] == {"name": "add", "arguments": ""} and first["id"]
    assert set(args) == {"index", "function"} and json.loads(args["function"]["arguments"]) == {"a": 1}
    content, calls = merge(deltas)
    assert content == "" and [c["function"]["name"] for c in calls] == ["add", "mood"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"happy": True}


def test_bench_serve_load_generator():
    jobs = [Job({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                 "structured_outputs": {"regex": "[a-c]{4}"}},
                lambda t: (len(t) == 4, "")),
            Job({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, lambda t: (True, "")),
            Job({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3,  # cut short
                 "structured_outputs": {"regex": "[a-c]{6}"}}, lambda t: (len(t) == 6, ""))]
    with running(create_app(tiny_engine(), served_model_name=MODEL, api_key=KEY)) as base:
        level = asyncio.run(run_level(base, jobs, concurrency=3, requests=6, rate=50.0, api_key=KEY))
    assert level["requests"] == 6 and level["errors"] == 2 and level["cut"] == 2 and level["invalid"] == 0
    assert "HTTP 404" in level["error_messages"][0]  # an unknown model, as OpenAI answers it
    assert level["ttft_s"]["p50"] > 0 and level["e2e_s"]["p99"] >= level["e2e_s"]["p50"]
    assert "| 3 | 6 | 2 | 2 | 0 |" in table([level])


def test_a_cut_after_complete_arguments_reports_exactly_those_arguments():
    """max_tokens ending the reply after the arguments' closing brace (inside the call's own `}` or the closing
    tag) gives the arguments as written, not with `}` and a piece of `</tool_call>` glued on."""
    from specstruct.constraints.tools.grammar import ToolCallStreamer

    head = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}'
    for tail in ("", "}", "}\n<", "}\n</tool_", "}\n</tool_cal"):
        text, calls = ToolCallStreamer().cut(head + tail)
        assert text == "" and [c["arguments"] for c in calls] == ['{"city": "Paris"}'], tail
    _, calls = ToolCallStreamer().cut('<tool_call>\n{"name": "f", "arguments": {"city": "Pa')
    assert calls[0]["arguments"] == '{"city": "Pa'  # still inside the arguments: as far as written


def test_a_cut_inside_the_call_name_leaves_no_markup_in_the_text():
    from specstruct.constraints.tools.grammar import ToolCallStreamer

    assert ToolCallStreamer().cut('Sure.<tool_call>\n{"name": "noar') == ("Sure.", [])
    streamer = ToolCallStreamer()
    streamer.feed('<tool_call>\n{"name": "noar')
    assert streamer.cut() == ("", [])


def test_text_then_a_call_with_marker_tokens_gives_content_and_the_checked_call():
    """With `<tool_call>` as one added token (Qwen), "auto" allows text before the calls: the server returns the
    text as content and the call as tool_calls, streamed or not (the grammar still checks the call)."""
    import copy

    import httpx

    from specstruct.serving.openai import ServerLimits
    from specstruct.testing import scripted_engine

    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    engine = scripted_engine(text, tokenizer=tok, max_new_tokens=200)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 200}
    app = create_app(engine, served_model_name=MODEL, api_key=KEY, limits=ServerLimits(max_tokens_cap=300))
    with running(app) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as c:
        msg = c.post("/chat/completions", json=body).json()["choices"][0]["message"]
        assert msg["content"] == "Let me check."
        assert [(t["function"]["name"], json.loads(t["function"]["arguments"])) for t in msg["tool_calls"]] == [
            ("get_weather", {"city": "Paris"})]
        chunks = [json.loads(line[6:]) for line in c.post("/chat/completions", json={**body, "stream": True}).text
                  .splitlines() if line.startswith("data: {")]
        deltas = [{k: v for k, v in ch["choices"][0]["delta"].items() if v is not None} for ch in chunks
                  if ch["choices"]]
        content, calls = merge(deltas)
        assert content == "Let me check." and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
