"""What a prompt may be, checked before anything is tokenized: a string, or a list of chat messages
`{"role": "system" | "user" | "assistant" | "tool", "content": str, ...}`. Anything else is an
InvalidPromptError that names the item and the fix, never a tokenizer's TypeError or a silently rendered message."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specstruct.errors import InvalidParameterError, InvalidPromptError, PromptTooLongError

if TYPE_CHECKING:
    import torch

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, Any]  # a chat message: {"role": ..., "content": ..., ...}
Tool = dict[str, Any]  # an OpenAI-style tool: {"type": "function", "function": {...}}


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidPromptError(
            f"{where} holds a lone surrogate {text[err.start]!r} at character {err.start}, which is not valid "
            "Unicode text; decode the source with errors='replace' or remove it") from None


@dataclass(frozen=True)
class RawPrompt:
    """Text the model continues as written: no chat template and no system message (the output type is not quoted
    to the model), and no validation retries (there is no conversation to feed an error back into). What an OpenAI
    `/v1/completions` request sends, and what a base model wants: `engine.run(ss.RawPrompt("def add("), ...)`."""

    text: str


def check_prompt(prompt: object) -> list[Message] | RawPrompt:
    """The prompt as chat messages (copies), a RawPrompt as is, or InvalidPromptError."""
    if isinstance(prompt, RawPrompt):
        if not isinstance(prompt.text, str) or not prompt.text:
            raise InvalidPromptError(f"RawPrompt takes the text as a non-empty str, got {prompt.text!r:.80}")
        _check_text(prompt.text, "the prompt")
        return prompt
    if isinstance(prompt, str):
        _check_text(prompt, "the prompt")
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (bytes, bytearray)):
        raise InvalidPromptError("the prompt is bytes; decode it to str first (e.g. prompt.decode('utf-8'))")
    if prompt is None or not isinstance(prompt, (list, tuple)):
        raise InvalidPromptError(f"the prompt must be a str or a list of chat messages, got {prompt!r:.80}"
                                 if prompt is not None else "the prompt is None; pass a str or a list of messages")
    if not prompt:
        raise InvalidPromptError("the prompt is an empty list of messages; pass at least one message")
    messages = []
    for i, m in enumerate(prompt):
        if not isinstance(m, dict):
            raise InvalidPromptError(f"message {i} is a {type(m).__name__}, not a dict like "
                                     '{"role": "user", "content": "..."}')
        if m.get("role") not in ROLES:
            raise InvalidPromptError(f"message {i} has role {m.get('role')!r}; use one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None and not (m["role"] == "assistant" and m.get("tool_calls")):
            raise InvalidPromptError(f"message {i} has no content; add \"content\": \"...\"")
        if content is not None and not isinstance(content, str):
            raise InvalidPromptError(f"message {i} has content of type {type(content).__name__}; content must "
                                     "be a str")
        if content is not None:
            _check_text(content, f"message {i}")
        messages.append(_dict_arguments(dict(m), i))
    return messages


def arguments_object(raw: Any) -> dict[str, Any]:
    """A call's arguments as the dict chat templates want, from OpenAI's JSON text (a dict as is); ValueError saying
    what is wrong (the caller names where). Shared with the server (serving/openai/translate.py)."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"is not valid JSON ({e})") from None
    if not isinstance(value, dict):  # a call's arguments are one JSON object
        raise ValueError(f"must encode a JSON object, got {str(raw)[:60]!r}")
    return value


def _dict_arguments(message: dict[str, Any], i: int) -> dict[str, Any]:
    """OpenAI-shaped history holds a call's arguments as JSON text; chat templates write `arguments` with `tojson`,
    so text would be rendered as an escaped string (and the model then imitates it): decoded to a dict here, as the
    server does."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    fixed = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                arguments = arguments_object(function["arguments"])
            except ValueError as e:
                raise InvalidPromptError(f"message {i}: tool_calls[{j}].function.arguments {e}") from None
            call = {**call, "function": {**function, "arguments": arguments}}
        fixed.append(call)
    return {**message, "tool_calls": fixed}


def check_system(system: object) -> None:
    if system is not None and not isinstance(system, str):
        raise InvalidPromptError(f"system= takes the system message as a str, got {type(system).__name__}")


def too_long(messages: "list[Message] | RawPrompt", ids: list[int], tokenizer: Any, max_new_tokens: int,
             limit: int) -> PromptTooLongError:
    """The error for a prompt that leaves no room for max_new_tokens; it says when the system message (where the
    output type is quoted for the model: a long schema, option list or grammar) is most of the prompt."""
    system = (messages[0]["content"] if isinstance(messages, list) and messages and messages[0].get("role") == "system"
              else "")
    share = len(tokenizer.encode(system, add_special_tokens=False)) if isinstance(system, str) and system else 0
    where = (f" ({share} of them are the system message, which quotes the output type for the model: a long "
             "schema, option list or grammar; shorten it or the prompt)") if share > len(ids) // 2 else ""
    return PromptTooLongError(f"the prompt has {len(ids)} tokens{where} and max_new_tokens is {max_new_tokens}, but "
                              f"the model's context window is {limit} tokens: shorten the prompt or lower "
                              "max_new_tokens")


def check_models(model: object, draft_model: object) -> None:
    """TypeError unless both are loaded models (torch modules): a tokenizer in the model's place is a common slip."""
    import torch

    for name, value in (("model", model), ("draft_model", draft_model)):
        if value is not None and not isinstance(value, torch.nn.Module):
            raise TypeError(f"{name} must be a loaded transformers model (a torch.nn.Module), got "
                            f"{type(value).__name__}: the arguments are SpecStruct(model, tokenizer, draft_model=None)")


def resolve_device(device: str) -> str:
    """EngineConfig.device as from_pretrained loads to: "auto" is CUDA when torch sees one, else the CPU; asking for
    CUDA where there is none is an InvalidParameterError, not torch's assertion."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidParameterError(f"EngineConfig.device={device!r}, but this torch sees no CUDA device: use 'cpu' "
                                    "or 'auto'")
    return device


EOS_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>")


def eos_token_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Every id that ends a turn: the tokenizer's EOS, the generation config's, and the usual chat end tokens."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[name] for name in EOS_NAMES if name in vocab)
    return sorted(i for i in ids if i is not None)
