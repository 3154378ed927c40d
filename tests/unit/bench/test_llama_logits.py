"""benchmarks.llama_logits' report logic on canned llama-server replies (their shape as llama-server's `/completion`
returns them with `n_probs`): no server and no real model run here."""

from __future__ import annotations

import math

import pytest

from benchmarks import llama_logits as ll


def reply(token: int, top: list[tuple[int, float]]) -> dict:
    """A `/completion` reply for `n_predict: 1`, `n_probs: len(top)`, `return_tokens: true`."""
    return {"content": "x", "tokens": [token], "stop_type": "limit", "tokens_predicted": 1,
            "completion_probabilities": [{
                "id": token, "token": "x", "bytes": [120], "logprob": top[0][1],
                "top_logprobs": [{"id": t, "token": f"t{t}", "bytes": [116], "logprob": lp} for t, lp in top]}]}


def ours(*tops: list[tuple[int, float]]) -> dict:
    return {"numerics": "test", "threads": 2,
            "prompts": [{"id": f"p{i}", "ids": [1, 2, i], "top": [list(x) for x in top]} for i, top in enumerate(tops)]}


def test_parse_reply_reads_the_greedy_token_and_top_logprobs():
    got = ll.parse_reply(reply(7, [(7, -0.1), (3, -2.5)]))
    assert got == {"token": 7, "top": [[7, -0.1], [3, -2.5]]}


def test_a_reply_without_raw_logprobs_is_a_clear_error():
    post_sampling = {"tokens": [7], "completion_probabilities": [{"id": 7, "prob": 0.9, "top_probs": []}]}
    with pytest.raises(ValueError, match="post_sampling_probs"):
        ll.parse_reply(post_sampling)
    with pytest.raises(ValueError, match="n_probs"):
        ll.parse_reply({"tokens": [7], "content": "x"})


def test_the_request_sends_token_ids_for_one_greedy_token_with_raw_logprobs():
    body = ll.completion_body([10, 11, 12], 5)
    assert body["prompt"] == [10, 11, 12]
    assert body["n_predict"] == 1 and body["temperature"] == 0 and body["n_probs"] == 5
    assert not body.get("post_sampling_probs") and body["cache_prompt"] is False


def test_compare_counts_agreement_and_differences_over_tokens_both_sides_list():
    mine = ours([(7, -0.10), (3, -2.50), (9, -3.00)], [(4, -0.50), (5, -1.20), (6, -4.0)])
    other = [ll.parse_reply(reply(7, [(7, -0.12), (3, -2.40), (8, -3.10)])),   # 9 and 8 not on both lists
             ll.parse_reply(reply(4, [(4, -0.50), (5, -1.25), (6, -4.0)]))]
    r = ll.compare(mine, other)
    assert (r["agree"], r["n"], r["compared"]) == (2, 2, 5)
    assert r["max_abs"] == pytest.approx(0.10)
    assert r["median_abs"] == pytest.approx(0.02)
    assert r["closest_margin"] == pytest.approx(0.70)  # the second prompt's, on specstruct's side
    assert r["disagreements"] == [] and r["verdict"] == "ok"


def test_a_flip_between_near_ties_is_rounding_and_a_decisive_one_is_not():
    mine = ours([(7, -0.70), (3, -0.72)], [(4, -0.1), (5, -3.0)])
    other = [ll.parse_reply(reply(3, [(3, -0.69), (7, -0.71)])),   # near-tie on both sides
             ll.parse_reply(reply(5, [(5, -0.2), (4, -2.5)]))]     # both sides sure, of different tokens
    r = ll.compare(mine, other, rounding=0.05)
    assert r["agree"] == 0
    tie, decisive = r["disagreements"]
    assert (tie["id"], tie["ours"], tie["theirs"], tie["rounding"]) == ("p0", 7, 3, True)
    assert tie["margin_ours"] == pytest.approx(0.02) and tie["margin_theirs"] == pytest.approx(0.02)
    assert (decisive["ours"], decisive["theirs"], decisive["rounding"]) == (4, 5, False)
    assert decisive["margin_ours"] == pytest.approx(2.9) and decisive["margin_theirs"] == pytest.approx(2.3)
    assert r["verdict"] == "beyond rounding"
    table = ll.markdown([("f.gguf", r)], 2)
    assert "| f.gguf | 0/2 |" in table and "| 0.020 | p0:" in table and "p0: 0.020 / 0.020" in table and "beyond rounding" in table


def test_mismatched_prompt_counts_are_refused():
    with pytest.raises(ValueError, match="2 prompts on specstruct's side, 1 on llama.cpp's"):
        ll.compare(ours([(1, -0.1), (2, -3.0)], [(1, -0.1), (2, -3.0)]), [ll.parse_reply(reply(1, [(1, -0.1)]))])


def test_theirs_posts_each_prompts_ids_and_stops_the_server(monkeypatch):
    import httpx

    from specstruct.bench import llama_cpp

    events, bodies = [], []

    class FakeSide:
        def __init__(self, binary, gguf, threads, context):
            events.append(("init", threads, context))
            self.url = "http://fake"

        def start(self):
            events.append("start")

        def close(self):
            events.append("close")

    class Resp:
        status_code = 200

        def __init__(self, body):
            self.body = body

        def json(self):
            return reply(body_token(self.body), [(body_token(self.body), -0.05), (0, -3.0)])

    def body_token(body):
        return body["prompt"][-1]

    def post(url, json, timeout):
        assert url == "http://fake/completion"
        bodies.append(json)
        return Resp(json)

    monkeypatch.setattr(llama_cpp, "LlamaCppSide", FakeSide)
    monkeypatch.setattr(httpx, "post", post)
    got = ll.theirs("llama-server", "m.gguf", 2, [[1, 2, 3], [4, 5]], 2)
    assert [b["prompt"] for b in bodies] == [[1, 2, 3], [4, 5]]
    assert [g["token"] for g in got] == [3, 5]
    assert events == [("init", 2, 3 + 16), "start", "close"]


def test_margin_of_a_single_entry_is_unbounded():
    assert math.isinf(ll.margin([[1, -0.0]]))
