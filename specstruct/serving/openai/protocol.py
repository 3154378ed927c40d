"""Request bodies of the OpenAI API, as Pydantic models. Unknown fields are accepted and ignored (clients send
many harmless ones); fields the server cannot honour are refused by `refuse_unsupported` with a 400."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specstruct.serving.openai.errors import bad_request


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
    # strict: "0.5" or true for a number is a 400, as OpenAI answers (an int is still a valid float)
    max_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float | None = Field(None, ge=0, le=2, strict=True, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, strict=True, allow_inf_nan=False)
    # 0 to 2**64 - 1: what torch.Generator.manual_seed takes, without the negatives it folds onto positive seeds
    seed: int | None = Field(None, ge=0, le=2**64 - 1, strict=True)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM's per-tenant prefix-cache key: requests share cached prompt blocks only with the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=1024, strict=True)

    def stop_list(self) -> list[str] | None:
        return [self.stop] if isinstance(self.stop, str) else (self.stop or None)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[Any]  # translate.completion_call: one text prompt (token-ID prompts get a clear 400)
    max_tokens: int | None = Field(16, ge=1, strict=True)  # OpenAI's default for completions
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
    logprobs = getattr(req, "logprobs", None)  # completions' logprobs=0 still asks for the sampled token's
    if logprobs not in (None, False) or (logprobs == 0 and isinstance(req, CompletionRequest)):
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
    _refuse_vllm_extras(extra)


# vLLM's sampling extensions (sent in `extra_body` by clients written for vLLM, whose `structured_outputs` this server
# speaks): each changes the output, so a value other than its no-op is refused rather than silently ignored.
_VLLM_NO_OPS = {"top_k": (None, 0, -1), "min_p": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
                "min_tokens": (None, 0), "ignore_eos": (None, False), "stop_token_ids": (None, []),
                "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
                "bad_words": (None, []), "allowed_token_ids": (None,), "prompt_logprobs": (None,),
                "use_beam_search": (None, False), "length_penalty": (None, 1, 1.0),
                # how vLLM renders the prompt (assistant prefill, template overrides): this server uses the model's
                # chat template as is, with a new assistant turn
                "continue_final_message": (None, False), "add_generation_prompt": (None, True),
                "chat_template": (None,), "chat_template_kwargs": (None, {})}
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def _refuse_vllm_extras(extra: dict[str, Any]) -> None:
    for name, no_ops in _VLLM_NO_OPS.items():
        value = extra.get(name)
        if not any(value is v or (type(value) is type(v) and value == v) for v in no_ops):
            raise bad_request(f"{name}={value!r} is not supported by this server (it would change the output); "
                              "omit it", name)


def structured_extra(req: _Sampling) -> dict[str, Any] | None:
    """`structured_outputs`, or the same from vLLM's older `guided_json` / `guided_regex` / `guided_choice` /
    `guided_grammar` fields (never silently ignored: those constrain the output)."""
    extra = req.model_extra or {}
    guided = {key: extra[name] for name, key in GUIDED.items() if extra.get(name) is not None}
    if guided and req.structured_outputs:
        raise bad_request("send structured_outputs or the older guided_* fields, not both", "structured_outputs")
    return req.structured_outputs or guided or None
