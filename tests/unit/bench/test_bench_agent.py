"""The agent scenario on tiny models: the tools answer from the shop's records, every call is checked against the
bound tools, the loop feeds results back turn after turn (the same system prompt and tools each time), each turn's
tool_choice ("required" while the playbook must act, then "auto") reaches every side, and the llama.cpp side's
requests and replies are built and read as the OpenAI API has them. Speed is not asserted."""

from __future__ import annotations

import json

import pytest

from specstruct.bench.agent import (LLAMA, SPEC, TARGET_ONLY, chat_body, check_calls, check_turn, markdown,
                                    parse_chat_reply, run_agent, run_episode, SpecStructAgent)
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


def test_the_llama_cpp_side_sends_the_same_history_and_reads_its_calls():
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": REQUESTS[0]},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "lookup_order", "arguments": {"order_id": "A-10442"}}}]},
               {"role": "tool", "tool_call_id": "call_1", "name": "lookup_order", "content": "{}"}]
    body = chat_body(history, Settings(max_new_tokens=99), "required")
    assert body["tools"] == TOOLS and body["max_tokens"] == 99 and body["temperature"] == 0.0
    assert body["tool_choice"] == "required" and chat_body(history, Settings())["tool_choice"] == "auto"
    assert body["cache_prompt"] is True
    sent = body["messages"][2]["tool_calls"][0]["function"]
    assert json.loads(sent["arguments"]) == {"order_id": "A-10442"}  # the OpenAI API's JSON string
    assert history[2]["tool_calls"][0]["function"]["arguments"] == {"order_id": "A-10442"}  # not changed in place

    def reply(calls, finish="tool_calls"):
        return {"choices": [{"finish_reason": finish, "message": {"content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 30}, "timings": {"prompt_ms": 1500.0, "cache_n": 800}}

    good = parse_chat_reply(reply([("track_shipment", '{"carrier": "UPS", "tracking_number": "1Z"}')]))
    assert good["error"] == "" and good["calls"][0]["arguments"] == {"carrier": "UPS", "tracking_number": "1Z"}
    assert good["prefill_s"] == 1.5 and good["cached_prompt_tokens"] == 800 and good["new_tokens"] == 30
    assert "not a bound tool" in parse_chat_reply(reply([("cancel_order", "{}")]))["error"]
    assert "not JSON" in parse_chat_reply(reply([("lookup_order", '{"order_id": ')]))["error"]
    assert "not one of" in parse_chat_reply(reply([("track_shipment", '{"carrier": "Royal Mail", '
                                                                       '"tracking_number": "1"}')]))["error"]
    assert parse_chat_reply(reply([], finish="length"))["cut"] is True
    assert parse_chat_reply(reply([]))["error"] == ""
    assert "required" in parse_chat_reply(reply([], finish="length"), "required")["error"]


def test_run_agent_needs_a_server_for_the_llama_cpp_side():
    with pytest.raises(ValueError, match="LlamaCppSide"):
        run_agent(scripted_engine("hi"), limit=1, baselines=["llama.cpp"])
