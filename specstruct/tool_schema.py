"""The JSON schema of one tool call, `{"name": <a bound tool>, "arguments": <that tool's parameters>}`, as the tool
grammar (tools.py) embeds it with llguidance's `%json`. Each tool's parameters are prepared exactly as a
`response_format` schema is (same coverage, ConstraintError naming the tool, keyword and path); parameters that use
`$ref` keep their pointers valid."""

from __future__ import annotations

import functools
import json
from typing import Any, Sequence

from specstruct.errors import ConstraintError

# Qwen's template serialises arguments with `tojson`: ", " and ": " separators, no newlines. Matching that
# exactly keeps the model on familiar ground and makes the punctuation forced text (free to draft).
_JSON_FORMAT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def tool_name(tool: dict[str, Any]) -> str:
    """The function name of an OpenAI tool dict (`{"type": "function", "function": {...}}`)."""
    return tool["function"]["name"]


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameter schema as the grammar embeds it: an object, closed so the model cannot invent arguments,
    prepared exactly as a `response_format` schema is (same coverage, same ConstraintError naming keyword and path,
    prefixed with the tool's name)."""
    params = tool["function"].get("parameters")
    params = {} if params is None else params
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise ConstraintError(f"tool {tool_name(tool)!r}: function.parameters must be a JSON schema of type "
                              f"\"object\" (a call's arguments are one JSON object), got {json.dumps(params)[:200]}")
    params = {"properties": {}, "additionalProperties": False, **params, "type": "object"}
    try:
        return json.loads(_prepared(json.dumps(params)))  # key order kept: it is the properties' order
    except ConstraintError as e:
        raise ConstraintError(f"tool {tool_name(tool)!r}: function.parameters: {e}") from e


@functools.lru_cache(maxsize=256)
def _prepared(params: str) -> str:  # the same tools come with every request of an agent
    from specstruct.constraints.json_llguidance import guaranteed_schema

    return json.dumps(guaranteed_schema(params))


_DATA = ("const", "enum", "default", "examples")  # values, not schemas: never rewritten


def _has_ref(node: Any) -> bool:
    if isinstance(node, dict):
        return isinstance(node.get("$ref"), str) or any(_has_ref(v) for k, v in node.items() if k not in _DATA)
    return isinstance(node, list) and any(_has_ref(v) for v in node)


def _moved(node: Any, to: str) -> Any:
    """`node` with each local `$ref` ("#", "#/$defs/X", ...) re-pointed to the same place under `#/$defs/<to>`."""
    if not isinstance(node, (dict, list)):
        return node
    if isinstance(node, list):
        return [_moved(v, to) for v in node]
    return {k: (f"#/$defs/{to}{v[1:]}" if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else v if k in _DATA else _moved(v, to)) for k, v in node.items()}


def call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One JSON schema for a call of any of `tools`: `{"name": <const>, "arguments": <its parameters>}`.

    llguidance wants alternatives as one `anyOf` inside a single `%json` rather than as Lark alternatives. A tool
    whose parameters use `$ref` (Pydantic's `$defs`, MCP tool schemas) is kept whole under the root's `$defs`, its
    references re-pointed there: nested inside the call schema, `#/$defs/...` would point at the wrong root.
    """
    defs, variants = {}, []
    for i, t in enumerate(tools):
        arguments = _arguments_schema(t)
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
