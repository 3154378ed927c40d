"""OpenAI request -> one specstruct call: the chat messages, the output type (response_format,
structured_outputs or the tool-call grammar) and the sampling keywords."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import specstruct as ss
from specstruct.api.inputs import arguments_object
from specstruct.constraints.tools import grammar as tool_core
from specstruct.errors import ConstraintError

from specstruct.serving.openai.errors import bad_request
from specstruct.serving.openai.limits import ServerLimits
from specstruct.serving.openai.protocol import (ChatCompletionRequest, CompletionRequest, Message, ToolChoice,
                                                refuse_unsupported, structured_extra)


@dataclass
class EngineCall:
    """A request resolved for `engine.astream(prompt, output_type, tools=..., **kwargs)`."""

    prompt: Any
    output_type: Any = None
    tools: list[dict[str, Any]] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    constraint_param: str | None = None  # the request field a ConstraintError is about
    mode: str = "text"  # text | json | regex | choice | grammar | tools (metrics label)
    fit_default: bool = False  # max_tokens not sent: the default shrinks to what the context window leaves

    @property
    def prompt_param(self) -> str:
        """The request field the prompt came from (errors about the prompt name it)."""
        return "messages" if isinstance(self.prompt, list) else "prompt"

    @property
    def max_new_tokens(self) -> int:
        return self.kwargs["max_new_tokens"]


def _max_tokens(value: int | None, limits: ServerLimits, param: str) -> int:
    if value is None:
        return min(limits.default_max_tokens, limits.max_tokens_cap)
    if value > limits.max_tokens_cap:
        raise bad_request(f"{param}={value} is over this server's cap of {limits.max_tokens_cap}; ask for fewer",
                          param)
    return value


def _size(value: Any) -> int:
    """Bytes of a request value as sent: a string's UTF-8, anything else as compact JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", "surrogatepass"))


def _over(what: str, amount: int, unit: str, limit: int, name: str, param: str, fix: str) -> None:
    if amount > limit:
        raise bad_request(f"{what} {amount} {unit}, over this server's limit of {limit} ({name}, set by the server's "
                          f"--{name.replace('_', '-')} option); {fix}", param, "limit_exceeded")


def check_sizes(req: ChatCompletionRequest | CompletionRequest, limits: ServerLimits) -> None:
    """400 naming the limit and its value for a request whose stop strings, tools or output constraint are larger
    than this server takes (before anything is compiled or rendered)."""
    stops = req.stop_list() or []
    _over("stop has", len(stops), "strings", limits.max_stop_sequences, "max_stop_sequences", "stop",
          "send fewer stop strings")
    _over("stop strings have", sum(len(s) for s in stops), "characters in all", limits.max_stop_chars,
          "max_stop_chars", "stop", "send shorter stop strings")
    tools = getattr(req, "tools", None) or []
    _over("tools has", len(tools), "tools", limits.max_tools, "max_tools", "tools",
          "send only the tools this request may call")
    if tools:
        _over("the tool definitions are", sum(_size(t.model_dump(exclude_none=True)) for t in tools), "bytes of JSON",
              limits.max_tools_bytes, "max_tools_bytes", "tools", "send fewer or smaller tools")
    named = "structured_outputs" if req.structured_outputs else "guided"  # the field the request sent
    sources = [(f"structured_outputs.{k}" if named == "structured_outputs" else f"guided_{k}", v)
               for k, v in (structured_extra(req) or {}).items() if v is not None]
    spec = (req.response_format or {}).get("json_schema")
    if isinstance(spec, dict) and spec.get("schema") is not None:
        sources.append(("response_format.json_schema.schema", spec["schema"]))
    for param, value in sources:
        _over(f"{param} is", _size(value), "bytes", limits.max_constraint_bytes, "max_constraint_bytes", param,
              "send a smaller schema, regex or grammar")


def _text(content: Any, where: str) -> str:
    """The text of a message's content: a string, or the text parts of a content list (other parts: 400)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and where.startswith("messages") and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])  # an assistant's refusal, replayed as the SDK types it: its text
            continue
        if kind != "text":
            raise bad_request(f"{where}.content[{i}] is a {kind!r} part; this server reads text parts only",
                              f"{where}.content")
        if not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content[{i}].text must be a string, got {part.get('text')!r}",
                              f"{where}.content[{i}].text")
        parts.append(part["text"])
    return "".join(parts)


def _arguments(raw: Any, where: str) -> dict[str, Any]:
    """A call's arguments as the dict chat templates want (OpenAI sends a JSON string): inputs.arguments_object."""
    try:
        return arguments_object(raw)
    except ValueError as e:
        raise bad_request(f"{where}.function.arguments {e}", f"{where}.function.arguments") from None


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI messages -> the dicts Hugging Face chat templates render (arguments as dicts, `developer` as
    `system`, a legacy `function` message as `tool`)."""
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        item: dict[str, Any] = {"role": role, "content": _text(m.content, where)}
        if m.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name,
                              "arguments": _arguments(c.function.arguments, f"{where}.tool_calls[{j}]")}}
                for j, c in enumerate(m.tool_calls)]
        if m.tool_call_id:
            item["tool_call_id"] = m.tool_call_id
        if m.name and role not in ("user", "system"):
            item["name"] = m.name
        out.append(item)
    return out


def structured_output_type(response_format: dict | None, structured: dict | None,
                           guided: bool = False) -> tuple[Any, str, str | None]:
    """(output type, mode, request field) for `response_format` / the extra `structured_outputs`."""
    if structured and (response_format or {}).get("type", "text") != "text":
        raise bad_request("send response_format or structured_outputs (or vLLM's guided_* fields), not both: "
                          "one would silently override the other", "structured_outputs")
    if structured:
        keys = [k for k in ("json", "regex", "choice", "grammar") if structured.get(k) is not None]
        if len(keys) != 1:
            raise bad_request("structured_outputs takes exactly one of json, regex, choice, grammar",
                              "structured_outputs")
        key, value = keys[0], structured[keys[0]]
        param = f"guided_{key}" if guided else f"structured_outputs.{key}"  # the field the request sent
        if key == "json":
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except json.JSONDecodeError as e:
                raise bad_request(f"structured_outputs.json is not valid JSON ({e})", param)
            if not isinstance(value, dict):
                raise bad_request("structured_outputs.json must be a JSON schema object", param)
            return value, "json", param
        if key == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise bad_request("structured_outputs.choice must be a non-empty list of strings", param)
            return ss.Choice(value), "choice", param
        if not isinstance(value, str):
            raise bad_request(f"{param} must be a string", param)
        return (ss.Regex(value), "regex", param) if key == "regex" else (ss.Grammar(value), "grammar", param)
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None, "text", None
    if kind == "json_object":
        return {"type": "object"}, "json", "response_format"
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        if not isinstance(spec, dict):
            raise bad_request('response_format.json_schema must be an object: {"name": ..., "schema": {...}}',
                              "response_format.json_schema")
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              "response_format.json_schema.schema")
        return schema, "json", "response_format.json_schema.schema"
    raise bad_request(f"response_format type {kind!r} is not supported; use text, json_object or json_schema",
                      "response_format.type")


def chat_call(req: ChatCompletionRequest, limits: ServerLimits, tokenizer: Any) -> EngineCall:
    """The EngineCall of a chat request. With tools this builds their grammar (slow for many or large tools): the
    server calls it off the event loop."""
    refuse_unsupported(req)
    check_sizes(req, limits)
    max_new = _max_tokens(req.max_completion_tokens or req.max_tokens,
                          limits, "max_completion_tokens" if req.max_completion_tokens else "max_tokens")
    output_type, mode, param = structured_output_type(req.response_format, structured_extra(req),
                                                    guided=not req.structured_outputs)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    tool_choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, ToolChoice) else req.tool_choice
    if tools and (output_type is None or tool_choice != "none"):
        if output_type is not None:
            raise bad_request("send either tools or a structured response format in one request, not both",
                              param.split(".")[0])
        try:  # tool_choice "none": free text that cannot open a call
            tools = tool_core.check_tools(tools, distinct=True)  # as OpenAI: one definition per name
            grammar = tool_core.tool_grammar(tools, tool_choice, tokenizer,
                                             parallel=req.parallel_tool_calls is not False)
        except ConstraintError as e:  # a tool's parameters schema
            raise bad_request(str(e), "tools", "unsupported_constraint")
        except ValueError as e:  # the tools themselves (duplicate names) or the tool_choice
            raise bad_request(str(e), "tools" if str(e).startswith("tools") else "tool_choice")
        mode = "text" if tool_choice == "none" else "tools"
        output_type, param = ss.Grammar(grammar, instruction=""), "tools"
    elif tool_choice == "required":
        raise bad_request('tool_choice "required" needs at least one tool, but the request has none', "tool_choice")
    elif tool_choice not in (None, "none", "auto"):
        raise bad_request("tool_choice names a tool but the request has no tools", "tool_choice")
    # stop applies with a constraint too, as OpenAI: an output it cuts short is reported cut. cache_salt: a tenant
    # shares cached prompt blocks only with requests of its own salt (no cached_tokens side channel across tenants)
    kwargs = dict(max_new_tokens=max_new, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                  stop=req.stop_list(), cache_salt=req.cache_salt)
    return EngineCall(chat_messages(req.messages), output_type, tools, kwargs, param, mode,
                      fit_default=(req.max_completion_tokens or req.max_tokens) is None)


def completion_call(req: CompletionRequest, limits: ServerLimits) -> EngineCall:
    refuse_unsupported(req)
    check_sizes(req, limits)
    prompt = req.prompt
    if isinstance(prompt, list):
        if not all(isinstance(p, str) for p in prompt):
            raise bad_request("prompts as token IDs are not supported by this server; send the prompt as text",
                              "prompt")
        if not prompt:
            raise bad_request("prompt is an empty list: send one prompt (a string)", "prompt")
        if len(prompt) != 1:
            raise bad_request("send one prompt per request (a list of several prompts is not supported)", "prompt")
        prompt = prompt[0]
    output_type, mode, param = structured_output_type(req.response_format, structured_extra(req),
                                                    guided=not req.structured_outputs)
    kwargs = dict(max_new_tokens=_max_tokens(req.max_tokens, limits, "max_tokens"), temperature=req.temperature,
                  top_p=req.top_p, seed=req.seed, stop=req.stop_list(), cache_salt=req.cache_salt)
    return EngineCall(ss.RawPrompt(prompt), output_type, None, kwargs, param, mode,  # continued as written
                      fit_default=req.max_tokens is None)  # "max_tokens": null: what the window leaves
