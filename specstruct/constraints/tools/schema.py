"""The JSON schema of one tool call, `{"name": <a bound tool>, "arguments": <that tool's parameters>}`, as the tool
grammar (grammar.py) embeds it with llguidance's `%json`. Each tool's parameters are prepared exactly as a
`response_format` schema is (same coverage, ConstraintError naming the tool, keyword and path); parameters that use
`$ref` keep their pointers valid."""

from __future__ import annotations

import json
from typing import Any, Sequence

from specstruct.constraints.cache import ByteLRU
from specstruct.constraints.limits import limits
from specstruct.constraints.llguidance.bounded import run_bounded
from specstruct.constraints.schema.logic import DATA, IGNORED, NAME_MAPS, dict_nodes
from specstruct.errors import ConstraintError, InvalidParameterError

# Qwen's template serialises arguments with `tojson`: ", " and ": " separators, no newlines. Matching that
# exactly keeps the model on familiar ground and makes the punctuation forced text (free to draft).
_JSON_FORMAT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool dict (`{"type": "function", "function": {...}}`)."""
    return tool["function"]["name"]


def check_tools(tools: Any, distinct: bool = False) -> list[dict[str, Any]]:
    """`tools` as a list of OpenAI tool dicts with string names (the same tool twice: once), or InvalidParameterError
    naming what is wrong (a raw KeyError or TypeError otherwise). `distinct`: two different tools of one name are
    refused too (a call to that name could match either); LangChain's standard tests bind a model and its schema
    under one name, so bind_tools allows it."""
    shape = '{"type": "function", "function": {"name": "...", "parameters": {...}}}'
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidParameterError(f"tools takes a list of tool dicts like {shape}, got {type(tools).__name__}")
    by_name: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"tools[{i}] is not a function tool with a name: {str(tool)[:120]}; "
                                        f"write it as {shape}")
        if distinct and name in by_name and by_name[name] != tool:
            raise InvalidParameterError(f"tools name {name!r} twice, with different definitions; give every tool "
                                        "its own name")
        by_name[name] = tool
    return list(by_name.values())  # the same tool bound twice is one tool


# a document's own URI and dialect: nested in the call schema, an `id` would become the base its `#/...` refs resolve in
_IDENTITY = ("$id", "id", "$schema")
# what a schema may hold and still say nothing about its keys: parameters with nothing else take no arguments
_ANNOTATIONS = IGNORED | {"type"}


def _parameters(tool: dict) -> str:
    """The tool's parameter schema as JSON text, as it is prepared: an object (ConstraintError for anything else), a
    tool that declares no arguments closed to `{}`, without a document identity."""
    given = tool["function"].get("parameters")
    params = {} if given is None else given
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ConstraintError(f"tool {tool_name(tool)!r}: function.parameters must be a JSON schema of type "
                              f"\"object\" (a call's arguments are one JSON object), got {json.dumps(params)[:200]}")
    if set(params) <= _ANNOTATIONS:  # a tool that declares no arguments takes none: `{}`
        params = {**params, "properties": {}, "additionalProperties": False}
    params = {k: v for k, v in params.items() if k not in _IDENTITY or not isinstance(v, str)} | {"type": "object"}
    return json.dumps(params)


def _arguments_schema(tool: dict[str, Any], prepared: "str | ConstraintError") -> dict[str, Any]:
    """The tool's parameter schema as the grammar embeds it: an object, closed so the model cannot invent arguments,
    prepared exactly as a `response_format` schema is (same coverage, same ConstraintError naming keyword and path,
    prefixed with the tool's name)."""
    if isinstance(prepared, str):
        return json.loads(prepared)  # key order kept: it is the properties' order
    hint = (" (it was read as an object schema, \"type\": \"object\": a call's arguments are one JSON object)"
            if "type" not in (tool["function"].get("parameters") or {}) and "admits no value" in str(prepared) else "")
    raise ConstraintError(f"tool {tool_name(tool)!r}: function.parameters: {prepared}{hint}") from prepared


# prepared parameter schemas (JSON text, or the refusal) by their JSON text: the same tools come with every request of
# an agent. Charged by their size against the compiled constraints' budget (`cache_mb`).
_PREPARED = ByteLRU(lambda: limits().cache_mb << 20)


def _prepared(tools: Sequence[dict], texts: Sequence[str]) -> dict[str, "str | ConstraintError"]:
    """Each of `texts` (the parameter schemas of `tools`) prepared as `response_format` schemas are; those not
    prepared before, all together in one child under the compile limits (llguidance/bounded.py): one request's tools
    take at most `time_s`, however many there are."""
    found: dict[str, str | ConstraintError | None] = {t: _PREPARED.get(t) for t in texts}
    todo = [t for t, hit in found.items() if hit is None]
    if todo:
        names = ", ".join(repr(tool_name(tool)) for tool, text in zip(tools, texts) if text in todo)
        what = f"preparing the parameters of tool{'s' if len(todo) > 1 else ''} {names[:300]}"
        for text, result in zip(todo, run_bounded(lambda: [_prepare(t) for t in todo], what)):
            found[text] = result
            _PREPARED.put(text, result, 1024 + 2 * (len(text) + len(str(result))))
    return found  # type: ignore[return-value]


def _prepare(text: str) -> "str | ConstraintError":
    from specstruct.constraints.llguidance.json_schema import guaranteed_schema

    try:
        return json.dumps(guaranteed_schema(text))
    except ConstraintError as e:
        return e


def _has_ref(node: Any) -> bool:
    return any(isinstance(n.get("$ref"), str) for n in dict_nodes(node, skip=DATA))


def _moved(node: Any, to: str) -> Any:
    """`node` with each local pointer `$ref` ("#", "#/$defs/X", ...) re-pointed to the same place under `#/$defs/<to>`."""
    if not isinstance(node, (dict, list)):
        return node
    if isinstance(node, list):
        return [_moved(v, to) for v in node]
    out = {}
    for k, v in node.items():
        if k == "$ref" and isinstance(v, str) and (v == "#" or v.startswith("#/")):  # a pointer; "#name" anchors stay
            out[k] = f"#/$defs/{to}{v[1:]}"
        elif k in NAME_MAPS and isinstance(v, dict):  # names, not keywords: a property may be called "default"
            out[k] = {name: _moved(s, to) for name, s in v.items()}
        else:
            out[k] = v if k in DATA else _moved(v, to)  # values, not schemas: never rewritten
    return out


def call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One JSON schema for a call of any of `tools`: `{"name": <const>, "arguments": <its parameters>}`.

    llguidance wants alternatives as one `anyOf` inside a single `%json` rather than as Lark alternatives. A tool
    whose parameters use `$ref` (Pydantic's `$defs`, MCP tool schemas) is kept whole under the root's `$defs`, its
    references re-pointed there: nested inside the call schema, `#/$defs/...` would point at the wrong root.
    """
    defs, variants = {}, []
    texts = [_parameters(t) for t in tools]
    prepared = _prepared(tools, texts)
    for i, (t, text) in enumerate(zip(tools, texts)):
        arguments = _arguments_schema(t, prepared[text])
        if _has_ref(arguments):
            defs[f"tool{i}"] = _moved(arguments, f"tool{i}")
            arguments = {"$ref": f"#/$defs/tool{i}"}
        variants.append({
            "type": "object",
            "properties": {"name": {"const": tool_name(t)}, "arguments": arguments},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    return {"x-guidance": _JSON_FORMAT, "anyOf": variants, **({"$defs": defs} if defs else {})}
