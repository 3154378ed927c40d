"""Stop strings cost work linear in the output: each new token is decoded a bounded number of times and each stop is
searched for only in the new text plus the stop's length before it, never the whole output again. Where a stop ends
the output stays exactly where one-token-at-a-time decoding over the whole text would put it."""

from __future__ import annotations

import random

import pytest

from specstruct.spec import stops
from specstruct.testing import scripted_engine, tiny_tokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Ada", "wrote",
         "the", "first", "program", "in", "1843", "{", "}", "\n", "```", "é", "日本"]


def essay(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Counting:
    """A tokenizer's decode that counts the token ids it was given, in all."""

    def __init__(self, tok):
        self.decode, self.ids = tok.decode, 0

    def __call__(self, ids, **kw):
        self.ids += len(ids)
        return self.decode(ids, **{"skip_special_tokens": True, **kw})


def reference(decode, ids, stop, code_fence=False):
    """One token at a time, the whole text decoded each time: the definition of where the output stops."""
    for t in range(1, len(ids) + 1):
        if stops.stop_index(decode(ids[:t]), stop, code_fence) is not None:
            return t
    return None


def test_a_long_output_decodes_each_token_a_bounded_number_of_times(monkeypatch):
    tok = tiny_tokenizer()
    text = essay(600)
    engine = scripted_engine(text, max_new_tokens=4000)
    n = len(tok.encode(text, add_special_tokens=False))
    counter = Counting(tok)
    monkeypatch.setattr(tok, "decode", counter)
    stop = [f"never-{i}" for i in range(16)]
    result = engine.run("write", stop=stop)
    assert result.finish_reason == "stop" and len(result.token_ids) == n  # EOS: the whole essay, nothing cut
    assert counter.ids < 12 * n, (counter.ids, n)  # was ~n * n / 2 (the whole output decoded again each step)
    counter.ids = 0
    chunks = list(engine.stream("write", stop=stop))
    assert "".join(c.text for c in chunks) == chunks[-1].result.text == text
    assert counter.ids < 20 * n, (counter.ids, n)  # the stream's detokenizer as well


def test_each_stop_is_searched_for_in_the_new_text_and_its_own_length_before_it():
    tok = tiny_tokenizer()
    ids = tok.encode(essay(2000, seed=1), add_special_tokens=False)
    stop = ["never here", "zz" * 40, "X"]
    scan = stops.StopScanner(Counting(tok), stop)
    for t in ids:
        assert scan.push([t]) is None
    chars = len(scan.text.text)
    # each character once per distinct stop length: the text ending there (the whole text per token and stop was
    # len(ids) * chars / 2 per stop, ~1,000x more here)
    assert scan.examined <= chars * sum({len(s) for s in stop})
    many = stops.StopScanner(Counting(tok), [f"never {i}" for i in range(100_000)])
    for t in ids[:500]:
        assert many.push([t]) is None
    assert many.examined <= len(many.text.text) * sum(range(7, 13))  # not 100,000 searches a token


@pytest.mark.parametrize("seed", range(40))
def test_where_the_output_stops_is_exactly_where_the_whole_text_says(seed):
    tok = tiny_tokenizer()
    rng = random.Random(seed)
    text = essay(rng.randrange(5, 80), seed=seed)
    ids = tok.encode(text, add_special_tokens=False)
    picks = [text[i : i + rng.randrange(1, 9)] for i in (rng.randrange(len(text)) for _ in range(rng.randrange(0, 3)))]
    stop = picks + rng.sample(["fox j", "\n```", "é", "日", "o", "missing", ""], rng.randrange(0, 3))
    code = seed % 3 == 0
    decode = Counting(tok)
    expected = reference(decode, ids, stop, code)
    scan, got, pushed = stops.StopScanner(decode, stop, code_fence=code), None, 0
    while got is None and pushed < len(ids):
        step = rng.randrange(1, 5)  # a step commits one token or several accepted drafts
        got = scan.push(ids[pushed : pushed + step])
        pushed += step
    assert got == expected, (text, stop, code)
    for end in range(len(text) + 1):  # what a stream holds back: the longest tail that begins a stop
        part = text[:end]
        hold = max([k for s in stop + (["\n```"] if code else []) for k in range(1, len(s)) if part.endswith(s[:k])],
                   default=0)
        assert stops.held_back(part, stop, code) == hold, (part, stop)


def test_the_stream_holds_back_a_partial_stop_and_never_passes_one():
    tok = tiny_tokenizer()
    detok_ids = tok.encode("Hello world. Goodbye.", add_special_tokens=False)
    from specstruct.api.streaming import IncrementalDetokenizer

    d = IncrementalDetokenizer(tok, ["Goodbye", "world!"])
    out = "".join(d.push([t]) for t in detok_ids)
    assert out == "Hello world. " and d.safe_text == out


def test_peek_is_the_whole_decode_and_pushes_nothing():
    tok = tiny_tokenizer()
    ids = tok.encode("Grüße aus Göteborg, 31 år", add_special_tokens=False)
    text = stops.IncrementalText(tok.decode)
    for i, t in enumerate(ids):
        assert text.peek(ids[i:]) == tok.decode(ids)  # ids still waiting for a whole character included
        held = (list(text.ids), text.text)
        text.push([t])
        assert text.peek([]) == tok.decode(ids[: i + 1])
    text.peek([1, 2, 3])
    assert text.ids == ids
    assert held[0] == ids[:-1]
