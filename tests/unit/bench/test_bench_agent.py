"""The agent scenario on tiny models: the tools answer from the shop's records, every call is checked against the
bound tools, the loop feeds results back turn after turn (the same system prompt and tools each time), each turn's
tool_choice ("required" while the playbook must act, then "auto") reaches every side, and the llama.cpp side's
requests and replies are built and read as the OpenAI API has them. Speed is not asserted."""

from __future__ import annotations

import json

import pytest

from specstruct.bench.agent import (LLAMA, SPEC, TARGET_ONLY, chat_body, check_calls, check_turn, forced_grammar,
                                    markdown, parse_chat_reply, run_agent, run_episode, SpecStructAgent)
from specstruct.bench.agent_tasks import FORCED_TURNS, REQUESTS, SYSTEM, TOOLS, call_tool, tool_choice
from specstruct.bench.measure import Settings
from specstruct.testing import scripted_engine

LOOKUP = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "A-10442"}}\n</tool_call>'


def test_the_tools_answer_from_the_records_and_say_what_is_unknown():
    order = call_tool("lookup_order", {"order_id": "A-10442"})
    assert order["carrier"] == "UPS" and order["email"] == "jordan.lee@example.com"
    assert "error" in call_tool("lookup_order", {"order_id": "A-99999"})
    parcel = call_tool("track_shipment", {"carrier": "UPS", "tracking_number": order["tracking_number"]})
    assert parcel["estimated_delivery"] == "2025-03-11"
    assert "error" in call_tool("track_shipment", {"carrier": "DHL", "tracking_number": order["tracking_number"]})
    assert call_tool("check_inventory", {"sku": "FP-1200", "warehouse": "Denver"})["units"] == 0
    assert call_tool("issue_refund", {"order_id": "A-10518", "amount": 24.0, "reason": "damaged"})["status"] == "issued"
    assert "error" in call_tool("issue_refund", {"order_id": "A-10518", "amount": 99.0, "reason": "damaged"})
    assert call_tool("search_policy", {"query": "cancel an order"})["results"][0].startswith("Cancellations")
    assert all(t["function"]["parameters"]["additionalProperties"] is False for t in TOOLS)


def test_calls_are_checked_against_the_bound_tools():
    assert check_calls([{"name": "lookup_order", "arguments": {"order_id": "A-1"}}]) == ""
    assert "not a bound tool" in check_calls([{"name": "delete_order", "arguments": {}}])
    assert "order_id" in check_calls([{"name": "lookup_order", "arguments": {}}])
    assert "not a JSON object" in check_calls([{"name": "lookup_order", "arguments": "A-1"}])
    refund = {"order_id": "A-1", "amount": 500, "reason": "damaged"}
    assert "200" in check_calls([{"name": "issue_refund", "arguments": refund}])  # above the schema's maximum


def test_a_required_turn_without_a_call_is_not_valid():
    lookup = [{"name": "lookup_order", "arguments": {"order_id": "A-1"}}]
    assert check_turn([], "auto") == "" and check_turn(lookup, "required") == ""
    assert "required" in check_turn([], "required")
    assert "not a bound tool" in check_turn([{"name": "delete_order", "arguments": {}}], "required")


def test_the_playbook_forces_the_opening_actions_then_lets_the_agent_answer():
    """Rule 1: every episode opens with a call; each request has one to three forced turns, then "auto"."""
    assert len(FORCED_TURNS) == len(REQUESTS) and all(1 <= n <= 3 for n in FORCED_TURNS)
    for episode, forced in enumerate(FORCED_TURNS):
        plan = [tool_choice(episode, k) for k in range(4)]
        assert plan == ["required"] * forced + ["auto"] * (4 - forced)


class Recorder:
    """A side that records each turn's history and tool_choice and answers with no call."""

    def __init__(self):
        self.choices: list[str] = []

    def turn(self, messages, choice="auto"):
        self.choices.append(choice)
        return dict(seconds=0.1, content="ok", calls=[], new_tokens=1, prompt_tokens=1, cached_prompt_tokens=0,
                    prefill_s=0.0, finish_reason="stop", cut=False, error=check_turn([], choice))


def test_the_loop_feeds_tool_results_back_and_later_turns_repeat_the_earlier_ones():
    """A scripted target calls lookup_order every turn: each turn's history holds the earlier turns, the tool
    results follow each call, every side gets the playbook's tool_choice, and speculation changes no token."""
    engine = scripted_engine(LOOKUP)
    settings = Settings(max_new_tokens=120)
    llama = Recorder()
    sides = {SPEC: SpecStructAgent(SPEC, engine, True, settings),
             TARGET_ONLY: SpecStructAgent(TARGET_ONLY, engine, False, settings), LLAMA: llama}
    seen: list[list[dict]] = []
    choices: list[str] = []
    turn = SpecStructAgent.turn

    def spy(self, messages, choice):
        seen.append(list(messages))
        choices.append(choice)
        return turn(self, messages, choice)

    sides[SPEC].turn = spy.__get__(sides[SPEC])
    turns = run_episode(REQUESTS[0], sides, max_turns=3)
    assert [t["turn"] for t in turns] == [1, 2, 3]
    assert [t["tool_choice"] for t in turns] == choices == llama.choices == ["required", "required", "auto"]
    assert [t["sides"][LLAMA]["error"] != "" for t in turns] == [True, True, False]  # no call where one was required
    assert not any(t["llama_agrees"] for t in turns)
    for t in turns:
        spec = t["sides"][SPEC]
        assert [c["name"] for c in spec["calls"]] == ["lookup_order"] and spec["error"] == "" and not spec["cut"]
        assert t["identical"] is True
    assert all(m[0] == {"role": "system", "content": SYSTEM} for m in seen)
    assert [len(m) for m in seen] == [2, 4, 6]  # + the reply and its tool result each turn
    assert seen[2][:4] == seen[1]  # a later turn repeats the earlier one
    result = json.loads(seen[1][3]["content"])
    assert seen[1][3]["role"] == "tool" and result["order_id"] == "A-10442"
    assert seen[1][2]["tool_calls"][0]["function"] == {"name": "lookup_order", "arguments": {"order_id": "A-10442"}}
    prompts = [t["sides"][SPEC]["prompt_tokens"] for t in turns]
    assert prompts[0] < prompts[1] < prompts[2]


def test_the_prefix_cache_serves_the_system_prompt_and_tools_every_episode_repeats(tok, target):
    import specstruct as ss

    engine = ss.SpecStruct(target, tok)
    res = run_agent(engine, limit=2, baselines=["specstruct"], settings=Settings(max_new_tokens=4))  # one turn each
    first, second = (t["sides"][SPEC] for t in res["turns"])
    assert first["cached_prompt_tokens"] == 0 and second["cached_prompt_tokens"] > second["prompt_tokens"] // 2
    # the target-only side answers the same first turn after specstruct, from its own (salted) cache: cold
    assert res["turns"][0]["sides"][TARGET_ONLY]["cached_prompt_tokens"] == 0


def test_a_reply_without_calls_ends_the_episode_and_the_report_totals_the_sides():
    engine = scripted_engine("Your parcel is delayed by weather and should arrive on March 11.")
    res = run_agent(engine, limit=2, baselines=["specstruct"], settings=Settings(max_new_tokens=100),
                    choices=lambda episode, turn: "auto")
    assert [(t["episode"], t["turn"]) for t in res["turns"]] == [(0, 1), (1, 1)]
    s = res["summary"]
    assert s["episodes"] == 2 and s["turns"] == 2 and s["identical"] == 2
    assert s[SPEC]["calls"] == 0 and s[SPEC]["valid_turns"] == 2 and s[SPEC]["cut_turns"] == 0
    assert s[SPEC]["seconds"] == pytest.approx(sum(t["sides"][SPEC]["seconds"] for t in res["turns"]))
    assert "specstruct_speedup" in s[TARGET_ONLY]
    text = markdown(res)
    assert "| all | 2 | |" in text and "| 1 | 1 | auto |" in text and "identical to specstruct's: 2/2" in text
    json.dumps(res)  # the --out file


HISTORY = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": REQUESTS[0]},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "lookup_order", "arguments": {"order_id": "A-10442"}}}]},
           {"role": "tool", "tool_call_id": "call_1", "name": "lookup_order", "content": "{}"}]

# llama-server's own conversion (json-schema-to-grammar) of forced_call_schema(TOOLS[:2]), as its /completion reported
# it in generation_settings.grammar
CONVERTED = r"""alternative-0 ::= "{" space alternative-0-name-kv "," space alternative-0-arguments-kv space "}"
alternative-0-arguments ::= "{" space alternative-0-arguments-order-id-kv space "}"
alternative-0-arguments-kv ::= "\"arguments\"" space ":" space alternative-0-arguments
alternative-0-arguments-order-id-kv ::= "\"order_id\"" space ":" space string
alternative-0-name ::= "\"lookup_order\""
alternative-0-name-kv ::= "\"name\"" space ":" space alternative-0-name
alternative-1 ::= "{" space alternative-1-name-kv "," space alternative-1-arguments-kv space "}"
alternative-1-arguments ::= "{" space alternative-1-arguments-carrier-kv "," space alternative-1-arguments-tracking-number-kv space "}"
alternative-1-arguments-carrier ::= ("\"UPS\"" | "\"FedEx\"" | "\"USPS\"" | "\"DHL\"")
alternative-1-arguments-carrier-kv ::= "\"carrier\"" space ":" space alternative-1-arguments-carrier
alternative-1-arguments-kv ::= "\"arguments\"" space ":" space alternative-1-arguments
alternative-1-arguments-tracking-number-kv ::= "\"tracking_number\"" space ":" space string
alternative-1-name ::= "\"track_shipment\""
alternative-1-name-kv ::= "\"name\"" space ":" space alternative-1-name
char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})
root ::= alternative-0 | alternative-1
space ::= | " " | "\n"{1,2} [ \t]{0,20}
string ::= "\"" char* "\""
"""
TRACK = ('<tool_call>\n{"name": "track_shipment", "arguments": {"carrier": "UPS", "tracking_number": "1Z"}}\n'
         '</tool_call>')


def test_auto_turns_reach_llama_server_as_they_are_and_required_ones_with_the_calls_grammar():
    body = chat_body(HISTORY, Settings(max_new_tokens=99), "auto")
    assert body["tools"] == TOOLS and body["max_tokens"] == 99 and body["temperature"] == 0.0
    assert body["tool_choice"] == "auto" and "grammar" not in body and body["cache_prompt"] is True
    sent = body["messages"][2]["tool_calls"][0]["function"]
    assert json.loads(sent["arguments"]) == {"order_id": "A-10442"}  # the OpenAI API's JSON string
    assert HISTORY[2]["tool_calls"][0]["function"]["arguments"] == {"order_id": "A-10442"}  # not changed in place
    forced = chat_body(HISTORY, Settings(max_new_tokens=99), "required", "root ::= x")
    # llama-server refuses a grammar next to tools unless tool_choice is "none"; the tools still render the prompt
    assert forced["tool_choice"] == "none" and forced["grammar"] == "root ::= x" and forced["tools"] == TOOLS
    assert {k: v for k, v in forced.items() if k not in ("tool_choice", "grammar")} == {
        k: v for k, v in body.items() if k != "tool_choice"}
    with pytest.raises(ValueError, match="forced_grammar"):
        chat_body(HISTORY, Settings(), "required")
    with pytest.raises(ValueError, match="'none'"):
        chat_body(HISTORY, Settings(), "none")


def test_the_forced_grammar_wraps_llama_servers_conversion_in_the_tool_call_markers():
    grammar = forced_grammar(CONVERTED, {"<tool_call>", "</tool_call>"})
    lines = grammar.splitlines()
    assert lines[:2] == ['root ::= tool-call ("\\n" tool-call)* "\\n"?',
                         'tool-call ::= <tool_call> "\\n" tool-call-json "\\n" </tool_call>']  # GBNF's token match
    assert lines[2:] == [ln.replace("root ::=", "tool-call-json ::=") for ln in CONVERTED.strip().splitlines()]
    assert "tool-call-json ::= alternative-0 | alternative-1" in lines
    text = forced_grammar(CONVERTED)  # markers the tokenizer does not hold as one token: matched as text
    assert 'tool-call ::= "<tool_call>" "\\n" tool-call-json "\\n" "</tool_call>"' in text.splitlines()
    # only rule names are renamed: not a string, a character class or a token that reads "root"
    odd = forced_grammar('root ::= "root" [root] item\nitem ::= "(" root ")" | <root>\n')
    assert 'tool-call-json ::= "root" [root] item' in odd and 'item ::= "(" tool-call-json ")" | <root>' in odd
    with pytest.raises(ValueError, match="tool-call"):
        forced_grammar('root ::= tool-call\ntool-call ::= "x"\n')
    with pytest.raises(ValueError, match="no root rule"):
        forced_grammar('start ::= "x"\n')


def test_the_forced_grammar_allows_what_specstructs_required_grammar_allows(tok):
    """llguidance reads the GBNF (its gbnf_to_lark), a reference this module did not write: the replies specstruct's
    "required" grammar allows are allowed, free text before, between or after the calls is not."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    from specstruct.constraints.base import ConstraintSpec
    from specstruct.constraints.compiler import compile_constraint
    from specstruct.constraints.tools.grammar import tool_grammar

    def constraint(lark):
        return compile_constraint(ConstraintSpec("grammar", lark), tok, vocab_size=408,
                                  eos_token_ids=[tok.eos_token_id])

    ours, theirs = constraint(tool_grammar(TOOLS[:2], "required")), constraint(gbnf_to_lark(forced_grammar(CONVERTED)))
    for reply in (LOOKUP, LOOKUP + "\n", f"{LOOKUP}\n{TRACK}", f"{TRACK}\n{LOOKUP}\n"):
        assert ours.accepts(reply) and theirs.accepts(reply), reply
    for reply in ("Let me look that up.\n" + LOOKUP, LOOKUP + "\nDone.", "I will call lookup_order.", "",
                  LOOKUP.replace("lookup_order", "issue_refund"), LOOKUP.replace("A-10442", "") + TRACK,
                  TRACK.replace("UPS", "Royal Mail")):
        assert not ours.accepts(reply) and not theirs.accepts(reply), reply
    spaced = LOOKUP.replace('{"name"', '{ "name"')
    assert theirs.accepts(spaced) and not ours.accepts(spaced)  # llama-server's JSON whitespace is freer


def _reply(content=None, calls=(), finish="tool_calls"):
    return {"choices": [{"finish_reason": finish, "message": {"content": content, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 30}, "timings": {"prompt_ms": 1500.0, "cache_n": 800}}


def test_auto_replies_are_read_from_llama_servers_calls():
    good = parse_chat_reply(_reply(calls=[("track_shipment", '{"carrier": "UPS", "tracking_number": "1Z"}')]))
    assert good["error"] == "" and good["calls"][0]["arguments"] == {"carrier": "UPS", "tracking_number": "1Z"}
    assert good["prefill_s"] == 1.5 and good["cached_prompt_tokens"] == 800 and good["new_tokens"] == 30
    assert "not a bound tool" in parse_chat_reply(_reply(calls=[("cancel_order", "{}")]))["error"]
    assert "not JSON" in parse_chat_reply(_reply(calls=[("lookup_order", '{"order_id": ')]))["error"]
    assert "not one of" in parse_chat_reply(_reply(calls=[("track_shipment", '{"carrier": "Royal Mail", '
                                                                             '"tracking_number": "1"}')]))["error"]
    assert parse_chat_reply(_reply(finish="length"))["cut"] is True
    assert parse_chat_reply(_reply())["error"] == ""
    assert parse_chat_reply(_reply(LOOKUP, finish="stop"))["calls"] == []  # "auto": llama-server's parse only


def test_required_replies_are_read_from_the_text_as_specstruct_reads_its_own():
    both = parse_chat_reply(_reply(f"{LOOKUP}\n{TRACK}", finish="stop"), "required")
    assert both["error"] == "" and both["content"] == "" and not both["cut"]
    assert [(c["name"], c["arguments"]) for c in both["calls"]] == [
        ("lookup_order", {"order_id": "A-10442"}), ("track_shipment", {"carrier": "UPS", "tracking_number": "1Z"})]
    refund = '<tool_call>\n{"name": "issue_refund", "arguments": {"order_id": "A-1", "amount": 500, ' \
             '"reason": "damaged"}}\n</tool_call>'
    assert "200" in parse_chat_reply(_reply(refund, finish="stop"), "required")["error"]  # llama-server's conversion leaves numbers unbounded
    cut = parse_chat_reply(_reply(LOOKUP[:30], finish="length"), "required")
    assert cut["cut"] and cut["calls"] == [] and "required" in cut["error"]
    assert "do not parse" in parse_chat_reply(_reply("<tool_call>\n{}\n</tool_call>", finish="stop"),
                                              "required")["error"]


def test_the_llama_side_converts_the_schema_and_checks_the_prompt_before_the_first_turn(monkeypatch):
    """Canned llama-server answers: the call schema goes to its json-schema-to-grammar once, a forced turn renders
    the prompt a "required" one does (else a clear error), then every turn is one /v1/chat/completions."""
    import httpx

    from specstruct.bench.agent import LlamaAgent, forced_call_schema

    sent: list[tuple[str, dict]] = []
    prompts = {"none": "P", "required": "P"}

    def post(url, json=None, timeout=None):
        sent.append((url.rsplit("/", 1)[-1], json))
        request = httpx.Request("POST", url)
        if url.endswith("/completion"):
            return httpx.Response(200, json={"content": "", "generation_settings": {"grammar": CONVERTED}},
                                  request=request)
        if url.endswith("/apply-template"):
            return httpx.Response(200, json={"prompt": prompts[json["tool_choice"]]}, request=request)
        content = LOOKUP if json.get("grammar") else "Hi!"
        return httpx.Response(200, json=_reply(content, finish="stop"), request=request)

    class Server:
        url, started = "http://llama", 0

        def start(self):
            self.started += 1

    monkeypatch.setattr(httpx, "post", post)
    side = LlamaAgent(Server(), Settings(max_new_tokens=50), {"<tool_call>", "</tool_call>"})
    side.warm_up()
    assert side.server.started == 1 and side.grammar == forced_grammar(CONVERTED, {"<tool_call>", "</tool_call>"})
    assert sent[0] == ("completion", {"prompt": "", "n_predict": 0, "json_schema": forced_call_schema()})
    assert [s[0] for s in sent[1:]] == ["apply-template"] * 2 + ["completions"] * 2
    assert [s[1]["max_tokens"] for s in sent[3:]] == [4, 4]  # brief warm-up turns
    sent.clear()
    reply = side.turn(HISTORY, "required")
    assert reply["error"] == "" and [c["name"] for c in reply["calls"]] == ["lookup_order"]
    assert sent[0][1]["grammar"] == side.grammar and sent[0][1]["max_tokens"] == 50
    prompts["none"] = "Q"
    with pytest.raises(RuntimeError, match="another prompt"):
        LlamaAgent(Server(), Settings()).warm_up()


def test_run_agent_needs_a_server_for_the_llama_cpp_side():
    with pytest.raises(ValueError, match="LlamaCppSide"):
        run_agent(scripted_engine("hi"), limit=1, baselines=["llama.cpp"])
