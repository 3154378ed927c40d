"""Request bodies of the OpenAI API, as Pydantic models. Unknown fields are accepted and ignored (clients send
many harmless ones); fields the server cannot honour are refused by `refuse_unsupported` with a 400."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import bad_request


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool = False


class FunctionDef(_Open):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule: a chat template writes it verbatim
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class CalledFunction(_Open):
    name: str
    arguments: str | dict[str, Any] | None = None  # OpenAI sends JSON text; a dict is accepted too


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ChosenFunction(_Open):
    name: str


class ToolChoice(_Open):
    type: Literal["function"] = "function"
    function: ChosenFunction


class _Sampling(_Open):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    def stop_list(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else (self.stop or None)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[Any]  # translate.completion_call: one text prompt (token-ID prompts get a clear 400)
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


def refuse_unsupported(req: _Sampling) -> None:
    """400 for a field whose value the server cannot honour (rather than silently ignoring it)."""
    extra = req.model_extra or {}
    for legacy, use in (("functions", "tools"), ("function_call", "tool_choice")):
        if extra.get(legacy) is not None:
            raise bad_request(f"{legacy} (the deprecated function-calling fields) is not supported by this server; "
                              f"send {use} instead", legacy)
    modalities = extra.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad_request(f"modalities={modalities!r} is not supported: this server writes text only; send "
                          '["text"] or omit it', "modalities")
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if req.n not in (None, 1):
        raise bad_request(f"n={req.n} is not supported: this server returns one choice per request; send n=1 "
                          "or several requests", "n")
    logprobs = getattr(req, "logprobs", None)
    if logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported by this server; omit logprobs or set it to false", "logprobs")
    if getattr(req, "top_logprobs", None):
        raise bad_request("top_logprobs is not supported by this server; omit it", "top_logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise bad_request(f"{name} is not supported by this server; omit it or send 0", name)
    if req.logit_bias:
        raise bad_request("logit_bias is not supported by this server; use structured_outputs to restrict the "
                          "output instead", "logit_bias")
    if getattr(req, "echo", False):
        raise bad_request("echo=true is not supported by this server", "echo")
    if getattr(req, "best_of", None) not in (None, 1):
        raise bad_request("best_of > 1 is not supported by this server", "best_of")
    if getattr(req, "suffix", None):
        raise bad_request("suffix (insertion) is not supported by this server", "suffix")
