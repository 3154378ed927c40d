"""`with_structured_output` for ChatSpecStruct: the schema becomes the engine's constraint, LangChain's own
parsers turn the (valid by construction) text or tool call back into the object the caller asked for."""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Literal

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass

Method = Literal["json_schema", "function_calling", "json_mode"]

# json_mode: any JSON object (the caller's prompt says which keys it wants).
ANY_OBJECT = {"type": "object"}


def _native_output_type(schema: Any) -> Any:
    """The schema itself when specstruct takes it as an output type (Pydantic v2 classes, TypedDicts):
    specstruct then relaxes what the grammar cannot express (e.g. `ge`/`le`) into validation after decoding,
    with retries that feed the validation error back to the model. None for anything else (JSON-schema dicts,
    Pydantic v1 classes), which go to the engine as their JSON schema."""
    if not isinstance(schema, type):
        return None
    from pydantic import v1

    if issubclass(schema, v1.BaseModel):
        return None  # Pydantic v2 cannot describe v1 classes: use their JSON schema
    from specstruct.errors import ConstraintError
    from specstruct.types.output import resolve

    try:
        resolve(schema)
    except ConstraintError:
        return None
    return schema


def structured_runnable(model: Any, schema: Any, method: Method, include_raw: bool, strict: bool | None) -> Runnable:
    """Build the runnable `model.with_structured_output(schema, method=..., include_raw=...)` returns.

    - json_schema: the reply is constrained to `schema` (the class itself for Pydantic/TypedDict, else its
      JSON schema, `response_format`) and parsed with PydanticOutputParser / JsonOutputParser;
    - function_calling: the reply is a forced call of a tool made from `schema` (see `bind_tools`), parsed
      with PydanticToolsParser / JsonOutputKeyToolsParser;
    - json_mode: the reply is constrained to some JSON object, parsed like json_schema.
    `strict` is accepted for API compatibility: decoding is always strict here.
    """
    if schema is None and method != "json_mode":
        raise ValueError(f"with_structured_output(method={method!r}) needs a schema; pass a Pydantic class, "
                         "TypedDict or JSON-schema dict, or use method='json_mode'.")
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, parallel_tool_calls=False,
                               ls_structured_output_format=ls_format)
        parser: Runnable = (PydanticToolsParser(tools=[schema], first_tool_only=True) if is_pydantic
                            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
    elif method in ("json_schema", "json_mode"):
        response_format = convert_to_json_schema(schema) if method == "json_schema" else ANY_OBJECT
        extra: dict[str, Any] = {"ls_structured_output_format": ls_format} if schema is not None else {}
        if method == "json_schema" and (native := _native_output_type(schema)) is not None:
            extra["output_type"] = native
        llm = model.bind(response_format=response_format, **extra)
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    else:
        raise ValueError(f"Unknown method {method!r}: use 'json_schema', 'function_calling' or 'json_mode'.")

    if not include_raw:
        return llm | parser
    parse = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    no_parse = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parse.with_fallbacks([no_parse], exception_key="parsing_error")
