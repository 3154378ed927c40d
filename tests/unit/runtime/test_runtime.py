import random

import torch

from specstruct.runtime.model_runtime import restore_stock
from specstruct.testing import tiny_model
from specstruct.testing import OneSequence


def _one_by_one(rt, prompt, rest):
    rt.prefill(prompt)
    return [rt.extend([t])[0] for t in rest]


def test_logits_do_not_depend_on_other_tokens_in_the_pass(tok, target):
    """Row invariance: a token's logits are bitwise the same whether it is verified alone or among others,
    including after crops that drop rejected tokens. This is what makes greedy speculation lossless."""
    rt = OneSequence(target)
    ids = tok.encode('{"name": "Ada Lovelace", "age": 36, "tags": ["math", "code"], "ok": true}',
                     add_special_tokens=False)
    prompt, rest = ids[:4], ids[4:]
    alone = _one_by_one(rt, prompt, rest)
    rng = random.Random(0)
    rt.prefill(prompt)
    chunked, i = [], 0
    while i < len(rest):
        block = rest[i : i + rng.randint(1, 9)]
        junk = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 3))]
        logits = rt.extend(block + junk)
        rt.crop(rt.length - len(junk))
        chunked.extend(logits[: len(block)])
        i += len(block)
    assert len(chunked) == len(alone)
    assert all(torch.equal(a, b) for a, b in zip(alone, chunked))


def test_row_invariant_numerics_match_stock_model_closely(tok):
    m = tiny_model(tok, seed=3)
    ids = tok.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False)
    with torch.no_grad():
        stock = m(torch.tensor([ids])).logits[0]
    rt = OneSequence(m)
    assert "row-invariant" in rt.numerics
    ours = torch.stack([rt.prefill(ids[:1])] + [rt.extend([t])[0] for t in ids[1:]])
    assert torch.allclose(ours, stock, atol=1e-4)
    restore_stock(m)
    with torch.no_grad():
        again = m(torch.tensor([ids])).logits[0]
    assert torch.equal(again, stock)


def test_crop_and_length(tok, target):
    rt = OneSequence(target)
    rt.prefill([1, 2, 3])
    rt.extend([4, 5])
    assert rt.length == 5
    rt.crop(3)
    assert rt.length == 3
    assert rt.extend([6]).shape == (1, rt.vocab_size)
