"""The agent scenario: a customer-support agent's multi-turn tool-calling loop (agent_tasks.py), through the Python
API with `tools=`, each turn measured on every side.

    specstruct bench --scenario agent --limit 3 --baselines specstruct,llama.cpp --llama-server PATH/llama-server

An episode starts from a customer's request. Each turn sends the same system prompt and tools and the history so
far; the reply's tool calls are run against the shop's records and their results appended, and the loop goes on
until a reply calls no tool (or `max_turns`, 4). specstruct (speculation on) drives the loop: its replies make the
history, so every side gets the same turns, with the prompt cache on, as an agent runs.

Each turn has a `tool_choice`, the same on every side, as agent frameworks set it: "required" on the opening turns
the playbook says must act (agent_tasks.FORCED_TURNS: the order lookup first, then tracking, a refund and its email,
the stock or the policy, one to three turns by request), "auto" after them, where the agent answers the customer.
That is OpenAI's `tool_choice="required"` (LangChain's `bind_tools(tool_choice="any")`, the OpenAI Agents SDK's
`ModelSettings(tool_choice="required")`, which hands back "auto" once a tool ran, so the loop can end) on the steps a
workflow agent must take, with the model choosing which tool and its arguments. Left on "auto" throughout, a small
model answers in prose that names the tool instead of calling it (Qwen2.5-Coder 1.5B does, on both sides), and the
scenario would measure no tool calls.

llama-server cannot force a call by itself. For Qwen2.5's template its `--jinja` chat handling (common/chat.cpp) finds
no specialised format and derives one (its "autoparser": JSON calls in `<tool_call>` tags); on "required" it builds a
grammar that is active from the first token, not lazy, but whose first item is optional free text up to the first
`<tool_call>` (`optional(content(until("<tool_call>"))) + calls`). `parallel_tool_calls` only says whether more than one
call may follow, and the request's `grammar` is refused next to tools unless `tool_choice` is "none". A model that does
not write `<tool_call>` on its own (the 1.5B model does not) writes prose until `max_tokens` cuts it: a turn without a
call, and a comparison of unlike replies. So on a "required" turn llama-server gets the constraint specstruct applies,
the way its users force a call: `tool_choice` "none" with the same `tools` (the template renders the same prompt;
the warm-up compares the two through `/apply-template`) and a GBNF `grammar` for specstruct's "required" replies (`forced_grammar`): one or
more `<tool_call>\n{call}\n</tool_call>` blocks, newline-separated, a newline after the last allowed, nothing else.
The markers are matched as the single tokens `<tool_call>` and `</tool_call>` (GBNF's token syntax) wherever
specstruct's grammar names them as tokens (Qwen2.5's tokenizer holds both); the call's JSON is llama-server's own
conversion of specstruct's call schema (`call_schema(TOOLS)`: each tool's name and its parameters), read back once,
untimed, from a zero-token `/completion` with that `json_schema`. That conversion lets JSON whitespace vary where
specstruct fixes `", "` and `": "`, and ignores a number's bounds (issue_refund's `amount` at most 200): a superset of
specstruct's replies, and the validity check still applies. The reply's text is read into calls by specstruct's own
`parse_tool_calls`. "auto" turns are sent as an agent framework sends them, `tool_choice` "auto": llama-server's own
lazy tool-call grammar and its own parsing of the calls, as specstruct's own "auto" grammar on the other side.

    specstruct   `engine.run(messages, tools=TOOLS, tool_choice=...)`: specstruct's tool-call grammar ("required":
                 calls only; "auto": text or calls), speculation on, the prefix cache on
    target-only  the same with speculation off (`--baselines specstruct`): its replies must be identical
    llama.cpp    llama-server's `/v1/chat/completions` with the same messages and `tools`, `cache_prompt` on, the same
                 GGUF file and thread count; "auto": `tool_choice` "auto" (its own chat template, tool-call grammar
                 and parsing); "required": `tool_choice` "none" and `grammar` (forced_grammar), parsed by
                 parse_tool_calls

(A tool_choice naming one function would pin the order lookup, but llama-server takes only "auto", "required" and
"none", so the model picks the tool on both sides.)

Every call of every side is checked: it names a bound tool and its arguments match that tool's schema, and a
"required" turn has at least one. Reported per turn and in total: the tool_choice, seconds, prompt tokens (and
those served by the cache), new tokens, the calls, whether they are valid, and whether llama.cpp's calls agree with
specstruct's.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from typing import Any, Callable, Collection, Sequence

from specstruct.bench.agent_tasks import JSON, REQUESTS, SYSTEM, TOOLS, call_tool, tool_choice
from specstruct.bench.measure import Settings
from specstruct.constraints.tools.grammar import CLOSE, OPEN, parse_tool_calls, special_markers
from specstruct.constraints.tools.schema import call_schema

Progress = Callable[[int, int, str], None] | None
SPEC, TARGET_ONLY, LLAMA = "specstruct", "target-only", "llama.cpp"
WARM_UP = [{"role": "user", "content": "Hello!"}]
CHOICES = ("auto", "required")  # the tool_choice values the episodes use (each side warms up both)


def check_calls(calls: Sequence[JSON], tools: Sequence[JSON] = TOOLS) -> str:
    """Why `calls` are not valid ("" when they are): each must name a bound tool, with arguments (a dict) that match
    the tool's parameter schema."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    for i, call in enumerate(calls):
        name, arguments = call.get("name"), call.get("arguments")
        if name not in schemas:
            return f"call {i} names {name!r}, which is not a bound tool"
        if not isinstance(arguments, dict):
            return f"call {i} ({name}): arguments are not a JSON object: {arguments!r:.80}"
        errors = sorted(jsonschema.Draft202012Validator(schemas[name]).iter_errors(arguments), key=str)
        if errors:
            return f"call {i} ({name}): {errors[0].message}"
    return ""


def check_turn(calls: Sequence[JSON], choice: str, tools: Sequence[JSON] = TOOLS) -> str:
    """Why a turn's `calls` are not valid under its tool_choice ("" when they are): `check_calls`, and a "required"
    turn must call a tool."""
    if choice == "required" and not calls:
        return 'no tool call on a turn with tool_choice "required"'
    return check_calls(calls, tools)


def _plain_calls(calls: Sequence[JSON]) -> list[JSON]:
    return [{"name": c["name"], "arguments": c["arguments"]} for c in calls]


class SpecStructAgent:
    """One specstruct side: `turn(messages)` is one `engine.run(messages, tools=TOOLS)`, the prefix cache on, salted
    with the side's name: two sides on one engine never serve each other's prompts (each reuses only its own turns)."""

    def __init__(self, name: str, engine: Any, speculative: bool, settings: Settings):
        self.name, self.engine, self.settings = name, engine, settings
        self.config = engine.config.merged(enable_speculative=speculative, max_retries=0, use_prefix_cache=True)

    def numerics(self) -> str:
        return str(getattr(self.engine, "numerics", ""))

    def turn(self, messages: list[JSON], choice: str = "auto") -> JSON:
        from specstruct.errors import IncompleteOutputError

        s = self.settings
        start = time.perf_counter()
        try:
            res = self.engine.run(messages, tools=TOOLS, tool_choice=choice, max_new_tokens=s.max_new_tokens,
                                  temperature=s.temperature, top_p=s.top_p, seed=s.seed, cache_salt=self.name,
                                  config=self.config)
            seconds = time.perf_counter() - start
            reply, stats, ids, finish = res.value, res.stats, list(res.token_ids), res.finish_reason
            content, calls = reply.content, list(reply.tool_calls)
        except IncompleteOutputError as exc:  # max_new_tokens cut the reply: still a timing, and the episode's end
            seconds = time.perf_counter() - start
            stats, ids, finish, content, calls = exc.stats, list(exc.token_ids), "length", exc.text, []
        return dict(seconds=seconds, content=content, calls=calls, token_ids=ids, new_tokens=len(ids),
                    prompt_tokens=getattr(stats, "prompt_tokens", None),
                    cached_prompt_tokens=getattr(stats, "cached_prompt_tokens", None),
                    prefill_s=getattr(stats, "prefill_s", None), finish_reason=finish,
                    tokens_per_forward=getattr(stats, "tokens_per_forward", None),
                    cut=finish == "length", error=check_turn(calls, choice))

    def warm_up(self) -> None:
        """Untimed calls (kernels, the tool grammar of each tool_choice); then an empty prefix cache, as a fresh agent
        starts."""
        for choice in CHOICES:
            _quiet_run(self.engine, WARM_UP, self.config, choice)
        self.engine.clear_cache()


def _quiet_run(engine: Any, messages: list[JSON], config: Any, choice: str) -> None:
    from specstruct.errors import IncompleteOutputError, ValidationRetryError

    try:
        engine.run(messages, tools=TOOLS, tool_choice=choice, max_new_tokens=4, config=config)
    except (IncompleteOutputError, ValidationRetryError):
        pass


def openai_messages(messages: Sequence[JSON]) -> list[JSON]:
    """The history as the OpenAI API sends it: tool-call arguments as JSON strings, content never null."""
    out = []
    for m in messages:
        item = {k: v for k, v in m.items() if k != "tool_calls"}
        item["content"] = m.get("content") or ""
        if m.get("tool_calls"):
            item["tool_calls"] = [{"id": c["id"], "type": "function",
                                   "function": {"name": c["function"]["name"],
                                                "arguments": json.dumps(c["function"]["arguments"])}}
                                  for c in m["tool_calls"]]
        out.append(item)
    return out


def forced_call_schema(tools: Sequence[JSON] = TOOLS) -> JSON:
    """The JSON schema of one call in specstruct's tool grammar (call_schema: `{"name": <a tool>, "arguments": <its
    parameters>}`), without llguidance's whitespace setting, which llama-server does not read."""
    return {k: v for k, v in call_schema(tools).items() if k != "x-guidance"}


# a GBNF grammar's lexemes: strings, character classes, token references, comments, names (the rest is punctuation)
_GBNF_LEXEME = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|!?<[^<>\s]+>|#[^\n]*|[A-Za-z0-9_-]+')
_GBNF_RULE = re.compile(r"^([A-Za-z0-9_-]+)\s*::=", re.MULTILINE)
CALL_RULE, JSON_RULE = "tool-call", "tool-call-json"


def _gbnf_marker(text: str, tokens: Collection[str]) -> str:
    return text if text in tokens else json.dumps(text)  # `<tool_call>` unquoted: GBNF's match of that one token


def forced_grammar(json_grammar: str, tokens: Collection[str] = ()) -> str:
    """llama-server's GBNF grammar for a "required" turn: the replies specstruct's "required" tool grammar allows
    (tool_grammar): `<tool_call>\\n{call}\\n</tool_call>` blocks, one or more, a newline between them and perhaps one
    after the last, nothing else. `json_grammar` is GBNF whose `root` is one call's JSON (llama-server's conversion of
    forced_call_schema); its root becomes `tool-call-json`. The markers in `tokens` (those the tokenizer holds as one
    added token, as specstruct.constraints.tools.grammar.special_markers finds them) are matched as that token, as
    specstruct's grammar matches them; the others as text."""
    taken = {CALL_RULE, JSON_RULE} & set(_GBNF_RULE.findall(json_grammar))
    if taken:
        raise ValueError(f"the call's JSON grammar already defines {sorted(taken)}: rename them there")
    if "root" not in _GBNF_RULE.findall(json_grammar):
        raise ValueError("the call's JSON grammar has no root rule: pass llama-server's conversion of the call schema")
    body = _GBNF_LEXEME.sub(lambda m: JSON_RULE if m.group(0) == "root" else m.group(0), json_grammar)
    return (f'root ::= {CALL_RULE} ("\\n" {CALL_RULE})* "\\n"?\n'
            f'{CALL_RULE} ::= {_gbnf_marker(OPEN, tokens)} "\\n" {JSON_RULE} "\\n" {_gbnf_marker(CLOSE, tokens)}\n'
            + body.strip() + "\n")


def chat_body(messages: Sequence[JSON], settings: Settings, choice: str = "auto", grammar: str | None = None) -> JSON:
    """llama-server's `/v1/chat/completions` body for one turn: the same messages and tools, greedy or sampled as the
    other sides, its prompt cache on (an agent's server keeps it on). "auto" goes as it is; "required" goes as
    `tool_choice` "none" (the same prompt: the tools are still rendered) with `grammar`, forced_grammar's calls
    (llama-server refuses a grammar next to tools on "auto" or "required")."""
    body = {"messages": openai_messages(messages), "tools": TOOLS, "tool_choice": choice,
            "max_tokens": settings.max_new_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
            "seed": settings.seed, "cache_prompt": True, "parallel_tool_calls": True}
    if choice == "required":
        if not grammar:
            raise ValueError('a "required" turn needs the calls\' grammar (forced_grammar) for llama-server')
        body.update(tool_choice="none", grammar=grammar)
    elif choice != "auto":
        raise ValueError(f"tool_choice {choice!r}: the agent scenario sends 'auto' or 'required'")
    return body


def _server_calls(message: JSON) -> tuple[list[JSON], str]:
    """The calls llama-server parsed (arguments from their JSON strings), and why they are not JSON ("" when they
    are)."""
    calls, error = [], ""
    for c in message.get("tool_calls") or []:
        fn = c.get("function") or {}
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments, error = fn.get("arguments"), error or f"{fn.get('name')}: arguments are not JSON"
        calls.append({"id": c.get("id", ""), "name": fn.get("name"), "arguments": arguments})
    return calls, error


def parse_chat_reply(data: JSON, choice: str = "auto") -> JSON:
    """A `/v1/chat/completions` reply -> content, calls, token counts, prefill time, whether max_tokens cut it, and why
    the calls are not valid under `choice` ("" when they are). On "auto" the calls are llama-server's own parse; on
    "required" (sent with forced_grammar) its text is read by parse_tool_calls, as specstruct reads its own."""
    first = data["choices"][0]
    message = first.get("message") or {}
    content, error = message.get("content") or "", ""
    if choice == "required":
        try:
            content, calls = parse_tool_calls(content)
        except (ValueError, KeyError, TypeError) as exc:
            calls, error = [], f"the reply's calls do not parse: {exc}"
    else:
        calls, error = _server_calls(message)
    usage, timings = data.get("usage") or {}, data.get("timings") or {}
    prompt_ms = timings.get("prompt_ms")
    return dict(content=content, calls=calls, new_tokens=int(usage.get("completion_tokens", 0)),
                prompt_tokens=usage.get("prompt_tokens"),
                cached_prompt_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens",
                                                                                    timings.get("cache_n")),
                prefill_s=prompt_ms / 1000 if prompt_ms is not None else None,
                finish_reason=first.get("finish_reason"), cut=first.get("finish_reason") == "length",
                error=error or check_turn(calls, choice))


def json_grammar_of(data: JSON) -> str:
    """The GBNF grammar llama-server converted a `json_schema` into, from a `/completion` reply's
    generation_settings."""
    grammar = (data.get("generation_settings") or {}).get("grammar")
    if not isinstance(grammar, str) or "root" not in _GBNF_RULE.findall(grammar):
        raise RuntimeError("llama-server's /completion reply holds no converted grammar (generation_settings.grammar): "
                           "this scenario needs a llama-server that reports it")
    return grammar


class LlamaAgent:
    """llama-server (a started LlamaCppSide) as the agent's other side: one `/v1/chat/completions` per turn. `tokens`:
    the tool-call markers the tokenizer holds as one token (forced_grammar matches them as tokens)."""

    name = LLAMA

    def __init__(self, server: Any, settings: Settings, tokens: Collection[str] = ()):
        self.server, self.settings, self.tokens = server, settings, set(tokens)
        self.grammar: str | None = None

    def numerics(self) -> str:
        return self.server.numerics()

    def turn(self, messages: list[JSON], choice: str = "auto", settings: Settings | None = None) -> JSON:
        import httpx

        body = chat_body(messages, settings or self.settings, choice, self.grammar)
        start = time.perf_counter()
        resp = httpx.post(self.server.url + "/v1/chat/completions", json=body, timeout=1800.0)
        seconds = time.perf_counter() - start
        if resp.status_code != 200:
            return dict(seconds=seconds, content="", calls=[], new_tokens=0, prompt_tokens=None,
                        cached_prompt_tokens=None, prefill_s=None, finish_reason=None, cut=False,
                        error=f"llama-server answered {resp.status_code}: {resp.text[:200]}")
        return dict(parse_chat_reply(resp.json(), choice), seconds=seconds)

    def prompt(self, body: JSON) -> str:
        """The prompt llama-server renders for a request body (`/apply-template`)."""
        import httpx

        resp = httpx.post(self.server.url + "/apply-template", json=body, timeout=60.0)
        resp.raise_for_status()
        return str(resp.json()["prompt"])

    def warm_up(self) -> None:
        """Start the server, convert the call schema into the forced turns' grammar (llama-server's own
        json-schema-to-grammar), check that a forced turn's body renders the prompt a plain "required" one does, and
        answer each tool_choice once, briefly."""
        import httpx

        self.server.start()
        resp = httpx.post(self.server.url + "/completion", timeout=60.0,
                          json={"prompt": "", "n_predict": 0, "json_schema": forced_call_schema()})
        resp.raise_for_status()
        self.grammar = forced_grammar(json_grammar_of(resp.json()), self.tokens)
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": REQUESTS[0]}]
        forced = chat_body(history, self.settings, "required", self.grammar)
        plain = {k: v for k, v in forced.items() if k != "grammar"} | {"tool_choice": "required"}
        if self.prompt(forced) != self.prompt(plain):
            raise RuntimeError('llama-server renders another prompt for tool_choice "none" than for "required": the '
                               "forced turns would not compare like with like")
        for choice in CHOICES:
            reply = self.turn(WARM_UP, choice, replace(self.settings, max_new_tokens=4))
            if reply["finish_reason"] is None:  # refused: a grammar it cannot parse, a template it cannot apply
                raise RuntimeError(f"llama-server refused a {choice!r} turn: {reply['error']}")


def assistant_message(reply: JSON) -> JSON:
    """The history's record of a reply: its text and its calls (arguments as dicts, as chat templates want)."""
    message: JSON = {"role": "assistant", "content": reply["content"]}
    if reply["calls"]:
        message["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for i, c in enumerate(reply["calls"])]
    return message


def tool_messages(reply: JSON) -> list[JSON]:
    """Each call's result, as the `tool` messages that follow the reply."""
    return [{"role": "tool", "tool_call_id": c.get("id") or f"call_{i}", "name": c["name"],
             "content": json.dumps(call_tool(c["name"], c["arguments"]))}
            for i, c in enumerate(reply["calls"])]


def run_episode(request: str, sides: JSON, max_turns: int, episode: int = 0, progress: Progress = None,
                choices: Callable[[int], str] | None = None) -> list[JSON]:
    """One customer request to the end of the loop. specstruct's replies make the history; every side answers each
    turn's history with the turn's tool_choice, `choices(turn)` (turns from 0; by default the playbook's,
    agent_tasks.tool_choice), the order of the sides alternating turn by turn. Returns one record per turn."""
    choices = choices or (lambda k: tool_choice(episode, k))
    messages: list[JSON] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]
    turns = []
    for k in range(max_turns):
        order = list(sides) if k % 2 == 0 else list(sides)[::-1]
        choice = choices(k)
        record: JSON = {"episode": episode, "turn": k + 1, "tool_choice": choice, "messages": len(messages),
                        "sides": {}}
        for name in order:
            if progress:
                progress(k, max_turns, f"episode {episode + 1}, turn {k + 1} ({choice}): {name}")
            record["sides"][name] = sides[name].turn(messages, choice)
        spec = record["sides"][SPEC]
        if TARGET_ONLY in record["sides"]:
            record["identical"] = record["sides"][TARGET_ONLY].get("token_ids") == spec["token_ids"]
        if LLAMA in record["sides"]:
            record["llama_agrees"] = _plain_calls(record["sides"][LLAMA]["calls"]) == _plain_calls(spec["calls"])
        turns.append(record)
        if not spec["calls"] or spec["error"] or spec["cut"]:
            break  # the agent answered the customer (or its reply was cut): the episode is over
        messages = messages + [assistant_message(spec)] + tool_messages(spec)
    return turns


def summarize(turns: list[JSON], names: Sequence[str]) -> JSON:
    out: JSON = {"episodes": len({t["episode"] for t in turns}), "turns": len(turns)}
    for name in names:
        rows = [t["sides"][name] for t in turns if name in t["sides"]]
        calls = sum(len(r["calls"]) for r in rows)
        out[name] = dict(seconds=sum(r["seconds"] for r in rows), new_tokens=sum(r["new_tokens"] for r in rows),
                         calls=calls, valid_turns=sum(not r["error"] for r in rows), turns=len(rows),
                         cut_turns=sum(bool(r["cut"]) for r in rows),
                         prompt_tokens=sum(r["prompt_tokens"] or 0 for r in rows),
                         cached_prompt_tokens=sum(r["cached_prompt_tokens"] or 0 for r in rows))
    for name in names:
        if name != SPEC and out[name]["seconds"] > 0:
            out[name]["specstruct_speedup"] = out[name]["seconds"] / out[SPEC]["seconds"]
    if TARGET_ONLY in names:
        out["identical"] = sum(bool(t.get("identical")) for t in turns)
    if LLAMA in names:
        out["llama_agrees"] = sum(bool(t.get("llama_agrees")) for t in turns)
    return out


def run_agent(engine: Any, *, limit: int | None = None, baselines: Sequence[str] = (), llama: Any = None,
              settings: Settings | None = None, max_turns: int = 4, progress: Progress = None,
              choices: Callable[[int, int], str] = tool_choice) -> JSON:
    """The agent scenario on `engine`: the first `limit` customer requests (all six by default). `baselines` may
    hold "specstruct" (the target-only side) and "llama.cpp" (then `llama` is a LlamaCppSide). `choices(episode,
    turn)` is each turn's tool_choice (the playbook's by default)."""
    settings = settings or Settings(max_new_tokens=256)
    sides: JSON = {SPEC: SpecStructAgent(SPEC, engine, True, settings)}
    if "specstruct" in baselines:
        sides[TARGET_ONLY] = SpecStructAgent(TARGET_ONLY, engine, False, settings)
    if "llama.cpp" in baselines:
        if llama is None:
            raise ValueError("the llama.cpp side needs a LlamaCppSide (llama-server and the GGUF file)")
        sides[LLAMA] = LlamaAgent(llama, settings, special_markers(engine.tokenizer))
    try:
        for side in sides.values():
            side.warm_up()
        turns = []
        for i, request in enumerate(REQUESTS[:limit]):
            turns += run_episode(request, sides, max_turns, i, progress, lambda k, i=i: choices(i, k))
    finally:
        if llama is not None:
            llama.close()
    for t in turns:  # the token ids served their comparison; the figures stay
        for side in t["sides"].values():
            side.pop("token_ids", None)
    return dict(turns=turns, summary=summarize(turns, list(sides)), sides=list(sides),
                numerics={name: side.numerics() for name, side in sides.items()},
                model=getattr(engine, "model_name", ""), settings=vars(settings))


def _validity(reply: JSON) -> str:
    return "NO" if reply["error"] else "cut" if reply["cut"] else "yes"


def _calls_text(reply: JSON) -> str:
    return ", ".join(c["name"] for c in reply["calls"]) or "(reply)"


def markdown(res: JSON) -> str:
    names, s = res["sides"], res["summary"]
    head = " | ".join(f"{n}, s" for n in names)
    llama = LLAMA in names
    calls_head = "specstruct's calls | llama.cpp's calls" if llama else "specstruct's calls"
    lines = [f"Model: {res['model']}; {s['episodes']} episodes, {s['turns']} turns; prompt caches on every side.", "",
             f"| episode | turn | tool_choice | prompt tokens (cached) | {head} | {calls_head} | valid |",
             "|---|---|---|---|" + "---|" * len(names) + "---|" * (2 + llama)]
    for t in res["turns"]:
        spec = t["sides"][SPEC]
        seconds = " | ".join(f"{t['sides'][n]['seconds']:.2f}" for n in names)
        calls = _calls_text(spec) + (f" | {_calls_text(t['sides'][LLAMA])}" if llama else "")
        valid = ", ".join(f"{n}: {_validity(t['sides'][n])}" for n in names)
        lines.append(f"| {t['episode'] + 1} | {t['turn']} | {t.get('tool_choice', 'auto')} "
                     f"| {spec['prompt_tokens']} ({spec['cached_prompt_tokens']}) "
                     f"| {seconds} | {calls} | {valid} |")
    total = " | ".join(f"**{s[n]['seconds']:.2f}**" for n in names)
    lines.append(f"| all | {s['turns']} | | | {total} | |{' |' * llama} |")
    lines += ["", "| side | seconds | new tokens | tool calls | turns with valid calls | cut by max tokens | "
                  "vs specstruct |", "|---|---|---|---|---|---|---|"]
    for n in names:
        ratio = f"{s[n]['specstruct_speedup']:.2f}x slower" if "specstruct_speedup" in s[n] else ""
        lines.append(f"| {n} | {s[n]['seconds']:.2f} | {s[n]['new_tokens']} | {s[n]['calls']} | "
                     f"{s[n]['valid_turns']}/{s[n]['turns']} | {s[n]['cut_turns']} | {ratio} |")
    if "identical" in s:
        lines.append(f"\ntarget-only replies identical to specstruct's: {s['identical']}/{s['turns']} turns.")
    if "llama_agrees" in s:
        lines.append(f"llama.cpp's calls the same as specstruct's: {s['llama_agrees']}/{s['turns']} turns "
                     "(its replies do not enter the history: both answer specstruct's turns); on \"required\" turns "
                     "it is sent tool_choice \"none\" and a GBNF grammar of the calls, specstruct's constraint.")
    lines += ["", *(f"- {n}: {res['numerics'][n]}" for n in names)]
    return "\n".join(lines) + "\n"


def main(engine: Any, console: Any, limit: int | None, settings: Settings, baselines: Sequence[str],
         llama: Any, out: str | None, markdown_out: str | None, progress: Progress) -> JSON:
    """`specstruct bench --scenario agent`: run, print the Markdown tables, write --out and --markdown."""
    from specstruct.bench.report import publish

    res = run_agent(engine, limit=limit, baselines=baselines, llama=llama, settings=settings, progress=progress)
    publish(res, console, out, None, markdown_out, show=lambda r, c: c.print(markdown(r)), render=markdown)
    return res
