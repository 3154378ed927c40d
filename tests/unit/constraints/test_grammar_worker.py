"""A user's Lark grammar whose llguidance matcher loops mid-output (past where the probe walks) ends that mask with a
ConstraintError naming `mask_time_s`, within it, and the process lives on with its memory; a normal grammar behaves
exactly as before. The looping case runs in a subprocess: where the loop is not contained it would hang (holding the
GIL) the process that runs it, so the test would hang instead of failing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time

import pytest

from specstruct.constraints import limits as L
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.errors import ConstraintError

LOOP = 'start: P A A\nP: /[xy]{300}/\nA: /b+/'  # 300 single-character tokens before the loop: the probe passes


def make(tok, source):
    return compile_constraint(ConstraintSpec("grammar", source), tok, vocab_size=408, eos_token_ids=[2])


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(L, "_LIMITS", dataclasses.replace(L.limits(), mask_time_s=1.0, time_s=3.0))


SCRIPT = textwrap.dedent("""
    import resource, time
    from specstruct.testing import tiny_tokenizer
    from specstruct.constraints import limits as L
    from specstruct.constraints.base import ConstraintSpec
    from specstruct.constraints.compiler import compile_constraint
    from specstruct.errors import ConstraintError

    L.set_limits(mask_time_s=1.0)
    tok = tiny_tokenizer()
    c = compile_constraint(ConstraintSpec("grammar", {loop!r}), tok, vocab_size=408, eos_token_ids=[2])
    ids = tok.encode("x" * 300, add_special_tokens=False)
    assert c.advance(ids) == len(ids)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for call in (c.mask, c.forced_text, c.fork().mask):
        start = time.monotonic()
        try:
            call()
            print("RETURNED", call)
        except ConstraintError as e:
            print("REFUSED", round(time.monotonic() - start, 2), str(e).replace("\\n", " "))
    print("RSS_GROWTH_MB", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) // 1024)
""")


@pytest.mark.slow
def test_a_grammar_that_loops_mid_output_fails_its_mask_within_the_limit():
    script = SCRIPT.format(loop=LOOP)
    start = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=40,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail("the looping mask never returned (llguidance holding the process)")
    assert out.returncode == 0, out.stderr[-3000:]
    refused = [line for line in out.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 3, out.stdout
    first = refused[0].split(" ", 2)
    assert float(first[1]) < 3.0  # the limit (1 s) and the kill, not llguidance's forever
    assert "limit mask_time_s=1.0" in first[2] and "SPECSTRUCT_MASK_TIME_S" in first[2]
    assert "A A" in first[2]  # says what to change in the grammar
    assert all(float(line.split(" ", 2)[1]) < 0.5 for line in refused[1:])  # the dead matcher answers at once
    growth = int(out.stdout.split("RSS_GROWTH_MB")[1].split()[0])
    assert growth < 100, out.stdout  # the loop's allocations died with the child
    assert time.monotonic() - start < 40


def test_a_normal_grammar_walks_forks_and_rolls_back_as_before(tok, quick):
    g = make(tok, 'start: "SELECT " COL " FROM " NAME\nCOL: /[a-z]+/\nNAME: /[a-z]+/')
    assert g.forced_text() == "SELECT "
    ids = tok.encode("SELECT ab FROM cd", add_special_tokens=False)
    fork = g.fork()
    assert fork.advance(ids) == len(ids) and fork.is_final() and bool(fork.mask()[2])
    fork.rollback(len(ids))
    assert not fork.is_final() and fork.forced_text() == "SELECT "
    assert g.accepts("SELECT x FROM y") and not g.accepts("SELECT X FROM y")
    assert not bool(g.mask()[2])  # EOS only where the output is complete


def test_the_child_is_gone_once_its_constraint_is(tok, quick):
    import gc

    from specstruct.constraints.llguidance import grammar_worker

    g = make(tok, 'start: "q" /[a-z]+/')
    pid = grammar_worker.pid_of(g._m)
    assert pid is not None and g.fork().advance(tok.encode("qab", add_special_tokens=False)) == 3
    del g
    gc.collect()
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie, no orphan
        os.waitpid(pid, os.WNOHANG)


def test_a_killed_child_fails_every_fork_at_once_and_others_go_on(tok, quick):
    from specstruct.constraints.llguidance import grammar_worker

    g = make(tok, 'start: "q" /[a-z]+/')
    fork = g.fork()
    os.kill(grammar_worker.pid_of(g._m), 9)  # as llguidance crashing would
    with pytest.raises(ConstraintError, match="llguidance"):
        fork.mask()
    with pytest.raises(ConstraintError, match="llguidance"):
        g.forced_text()
    assert make(tok, 'start: "q" /[a-z]+/').accepts("qz")  # a new request gets a new child
