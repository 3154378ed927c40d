"""Schemas and regexes built to explode: each gets a ConstraintError naming the limit, within the limit, and the
process lives on. Limits are kept small here so the tests are fast (see specstruct/constraints/limits.py)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from specstruct import settings
from specstruct.constraints import limits as L
from specstruct.constraints.base import ConstraintSpec
from specstruct.constraints.compiler import compile_constraint
from specstruct.errors import ConstraintError


@pytest.fixture(autouse=True)
def small_limits(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTRUCT_CACHE", str(tmp_path))
    settings.cache_clear()
    saved = L.limits()
    L.set_limits(time_s=3.0, memory_mb=512)
    yield
    L._LIMITS = saved


def make(tok, kind, source, backend=None):
    src = json.dumps(source) if not isinstance(source, str) else source
    return compile_constraint(ConstraintSpec(kind, src), tok, vocab_size=408, eos_token_ids=[2],
                              json_backend=backend)


def refused(tok, kind, source, limit, backend=None, within=10.0):
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="too complex") as e:
        make(tok, kind, source, backend)
    assert time.monotonic() - start < within
    assert f"limit {limit}=" in str(e.value) and "set_limits" in str(e.value)
    return str(e.value)


def test_huge_counted_repetitions_are_refused_statically(tok):
    refused(tok, "regex", "(a{1,1000}){1,1000}", "max_regex_size", within=1)
    refused(tok, "regex", "x{0,999999999}", "max_repeat", within=1)
    array = {"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000_000}
    refused(tok, "json", array, "max_repeat", backend="outlines", within=1)
    refused(tok, "json", {"type": "string", "minLength": 100_000}, "max_repeat", backend="outlines", within=1)


def test_slow_compile_is_stopped_at_the_time_limit_and_the_process_lives_on(tok):
    L.set_limits(time_s=1.0)
    refused(tok, "json", {}, "time_s", backend="outlines", within=8)  # outlines_core: ~60 s for `{}`
    assert make(tok, "regex", "[a-z]{2}").accepts("ab")  # a fresh worker takes over


def test_a_grammar_llguidance_loops_on_is_refused_within_the_time_limit(tok):
    """llguidance 1.9.1 never returns from the first mask of `A A` with `A: /b+/` (holding the GIL: the whole
    process froze); the grammar is walked in a forked child first (grammar_probe.py)."""
    L.set_limits(time_s=1.0)
    for grammar in ('start: A A\nA: /b+/', 'start: "q" /[a-z]/ A A\nA: /b+/'):
        message = refused(tok, "grammar", grammar, "time_s", within=5)
        assert "adjacent terminals" in message
    assert make(tok, "grammar", 'start: A " " A\nA: /b+/').accepts("bb b")  # a literal between them is fine


def test_memory_hungry_compile_is_stopped_at_the_memory_limit(tok):
    L.set_limits(memory_mb=64, time_s=20.0, max_regex_size=10**8)
    many = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(200)}}
    message = refused(tok, "json", many, "memory_mb", backend="outlines", within=25)
    assert "memory" in message
    assert make(tok, "regex", "[a-z]{3}").accepts("abc")


def test_llguidance_compiles_what_explodes_outlines_core(tok):
    start = time.monotonic()
    array = make(tok, "json", {"type": "array", "items": {"type": "integer"}, "maxItems": 1_000_000_000})
    long = make(tok, "json", {"type": "string", "minLength": 1000})
    anything = make(tok, "json", {})
    many = make(tok, "json", {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}})
    assert time.monotonic() - start < 10
    assert array.accepts("[1, 2, 3]") and not array.accepts("[1, 2,3]")
    assert long.accepts(json.dumps("x" * 1000)) and not long.accepts(json.dumps("x" * 999))
    assert anything.accepts('{"a": [1, {"b": null}], "c": "d"}')
    assert many.accepts('{"p0": 1, "p7": 2}') and not many.accepts('{"p7": 2, "p0": 1}')


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_deep_nesting_is_a_constraint_error(tok, backend):
    node: dict = {"type": "integer"}
    for _ in range(200):
        node = {"type": "array", "items": node}
    refused(tok, "json", node, "max_schema_depth", backend=backend, within=5)
    refused(tok, "json", "[" * 100_000 + "]" * 100_000, "max_schema_depth", backend=backend, within=5)


def test_recursive_ref_is_a_grammar_rule_and_remote_ref_is_refused(tok):
    tree = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {
        "type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v"]}}, "$ref": "#/$defs/n"}
    c = make(tok, "json", tree)
    deep = {"v": 1}
    for _ in range(12):
        deep = {"v": 1, "kids": [deep]}
    assert c.accepts(json.dumps(deep))
    with pytest.raises(ConstraintError, match=r"'\$ref' at #/properties/a.*remote"):
        make(tok, "json", {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})


def test_unsupported_keyword_names_keyword_and_path(tok):
    with pytest.raises(ConstraintError, match="'not' at #/properties/a"):
        make(tok, "json", {"type": "object", "properties": {"a": {"not": {"pattern": "^x"}}}})
    with pytest.raises(ConstraintError, match="'oneOf' at #/properties/x: its branches may overlap"):
        make(tok, "json", {"type": "object", "properties": {"x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}})


def test_formats_date_time_needs_an_offset_and_date_a_real_day(tok):
    c = make(tok, "json", {"type": "string", "format": "date-time"})
    assert c.accepts('"2024-01-01T10:00:00Z"') and c.accepts('"2024-01-01T10:00:00+01:00"')
    assert not c.accepts('"2024-01-01T10:00:00"')
    d = make(tok, "json", {"type": "string", "format": "date"})
    assert d.accepts('"2024-02-29"') and d.accepts('"2024-12-31"')
    assert not d.accepts('"2024-02-30"') and not d.accepts('"2024-04-31"') and not d.accepts('"2024-13-01"')


def test_in_memory_cache_is_bounded_by_bytes(tok):
    import specstruct.constraints.compiler as C

    L.set_limits(cache_mb=0)  # keeps only the newest program
    C._PROGRAMS.clear()
    for n in range(4):
        make(tok, "regex", f"[a-z]{{{n + 1}}}")
    assert len(C._PROGRAMS) == 1


def test_disk_cache_is_pruned_to_its_budget(tok, tmp_path):
    import specstruct.constraints.compiler as C

    L.set_limits(disk_cache_mb=0)
    C._PROGRAMS.clear()
    for n in range(3):
        make(tok, "regex", f"[0-9]{{{n + 1}}}")
    assert sum(p.stat().st_size for p in (tmp_path / "constraints").rglob("*.index")) == 0


def test_lexer_fuel_bounds_each_mask_and_the_default_admits_a_word_count_pattern(tok):
    """Github_easy---o21053's pattern (at most 100 words) inside a length bound: llguidance's default 200k fuel per
    mask stopped it mid-output on its own valid instances; the default lexer_fuel admits it, a small one still
    stops it with a typed error that names the knob (never an unconstrained mask)."""
    schema = {"type": "object", "required": ["q"], "properties": {"q": {
        "type": "string", "minLength": 1, "maxLength": 5000, "pattern": r"^$|(^(?:\S+\s+){0,99}\S+$)"}}}
    text = json.dumps({"q": "What is the primary function of the human brain?"})

    def walk() -> bool:
        c = make(tok, "json", schema)
        for t in tok.encode(text, add_special_tokens=False):
            assert c.mask()[t]
            c.advance([t])
        return c.is_final()

    assert walk()
    L.set_limits(lexer_fuel=200_000)
    with pytest.raises(ConstraintError, match="failed while generating") as e:
        walk()
    assert "lexer_fuel=200000" in str(e.value) and "SPECSTRUCT_LEXER_FUEL" in str(e.value)


def test_env_and_set_limits_name_the_knob():
    assert "SPECSTRUCT_COMPILE_TIME_S" in L.limits().describe("time_s")
    assert L.set_limits(time_s=7).time_s == 7


def test_a_forked_child_gets_its_own_compile_worker(tok):
    import os

    from specstruct.constraints.outlines import isolate

    make(tok, "regex", "[ab]{2}")
    parent = isolate._STATE["w"]
    pid = os.fork()
    if pid == 0:  # child: compiles through a new worker, never the parent's pipes
        ok = False
        try:
            ok = make(tok, "regex", "[cd]{2}").accepts("cd") and isolate._STATE["w"] is not parent
        finally:
            os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert parent.alive() and make(tok, "regex", "[ef]{2}").accepts("ef")


def test_the_grammar_probe_reaps_its_child_when_interrupted(tok, monkeypatch):
    """Ctrl-C while waiting must not leave a child spinning in llguidance's loop (an orphan at 100% CPU)."""
    import os
    import select as select_module

    from specstruct.constraints.llguidance import grammar_worker

    L.set_limits(time_s=5.0)
    children, walking = [], []
    real_fork, real_write, real_select = os.fork, grammar_worker._write, select_module.select

    def fork():
        pid = real_fork()
        if pid:
            children.append(pid)
        return pid

    def write(fd, data):
        walking.append(b"walk" in data)
        return real_write(fd, data)

    def select(*args):
        if walking and walking[-1]:
            raise KeyboardInterrupt
        return real_select(*args)

    monkeypatch.setattr(grammar_worker.os, "fork", fork)
    monkeypatch.setattr(grammar_worker, "_write", write)
    monkeypatch.setattr(select_module, "select", select)
    with pytest.raises(KeyboardInterrupt):
        make(tok, "grammar", 'start: A A\nA: /c+/')  # not one refused earlier in this process (remembered)
    (pid,) = children
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: killed, not left running


@pytest.mark.slow
def test_the_probe_reaches_a_loop_behind_a_long_terminal_and_remembers_a_refusal(tok):
    L.set_limits(time_s=1.0)
    grammar = 'start: X A A\nX: /[a-z]{300}/\nA: /b+/'  # 48 random short tokens never got past X
    refused(tok, "grammar", grammar, "time_s", within=5)
    refused(tok, "grammar", grammar, "time_s", within=0.5)  # the second time at once
    L.set_limits(time_s=2.0)
    start = time.monotonic()
    refused(tok, "grammar", grammar, "time_s", within=6)  # a larger budget probes again
    assert time.monotonic() - start > 1.5


def lark_alternatives(n: int) -> str:
    return "start: " + " | ".join(f'"w{i}x"' for i in range(n))


def test_a_grammar_compile_past_the_time_limit_ends_at_it(tok):
    """llguidance validates a grammar of n alternatives in time growing as n^2, with no clock of its own (200,000 took
    about four minutes): the compile runs in a child, killed at `time_s`, whatever the size limits let through."""
    from specstruct.constraints.compiler import check_spec

    L.set_limits(time_s=1.0)
    grammar = lark_alternatives(60_000)  # ~10 s to validate on a 2-core Xeon
    start = time.monotonic()
    refused(tok, "grammar", grammar, "time_s", within=2.5)
    assert time.monotonic() - start > 0.9
    with pytest.raises(ConstraintError, match="limit time_s=") as e:  # the check before a model loads, too
        check_spec(ConstraintSpec("grammar", grammar))
    assert "panicked" not in str(e.value)
    assert make(tok, "grammar", lark_alternatives(50)).accepts("w7x")  # and the next grammar compiles


def test_a_schema_compile_past_the_time_limit_ends_at_it(tok, monkeypatch):
    """A schema's first compile is a trial in a child under the compile limits (llguidance/bounded.py)."""
    from specstruct.constraints.llguidance import json_schema

    real = json_schema._grammar

    def slow(*args, **kwargs):
        time.sleep(30)
        return real(*args, **kwargs)

    L.set_limits(time_s=1.0)
    monkeypatch.setattr(json_schema, "_grammar", slow)
    refused(tok, "json", {"type": "object", "properties": {"slow": {"type": "integer"}}}, "time_s", within=2.5)
    monkeypatch.setattr(json_schema, "_grammar", real)
    assert make(tok, "json", {"type": "integer"}).accepts("12")


def test_an_llguidance_panic_is_one_line_naming_the_limit():
    from specstruct.constraints.llguidance.bounded import failure, panic

    class PanicException(BaseException):  # pyo3's, as llguidance raises it
        pass

    error = failure("the grammar", PanicException("assertion failed: grammar.symbols.len() < u16::MAX"))
    assert "65,535 grammar symbols" in str(error) and "u16" not in str(error)
    error = failure("the grammar", PanicException("index out of bounds\nstack backtrace:\n 0: rust_panic"))
    assert "internal error" in str(error) and "\n" not in str(error)
    # as llguidance's validate_grammar returns it (a 70,000-alternative grammar, given minutes)
    text = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n   0: <unknown>"
    assert "65,535 grammar symbols" in str(panic("the grammar", text))
    assert "internal error: panic: boom" in str(panic("the grammar", "panic: boom\n<backtrace>\n 0: x"))
    assert panic("the grammar", "expected rule at line 1") is None


def test_a_schema_with_an_integer_python_cannot_read_is_refused(tok):
    with pytest.raises(ConstraintError, match="not valid JSON.*digits"):
        make(tok, "json", '{"type": "integer", "maximum": ' + "9" * 5000 + "}")


def test_the_probe_remembers_grammars_by_digest_not_text(tok):
    from specstruct.constraints.llguidance import grammar_probe

    make(tok, "grammar", lark_alternatives(30))
    tables = (grammar_probe._PASSED, grammar_probe._REFUSED, grammar_probe._TRUSTED)
    assert grammar_probe._PASSED and all(isinstance(k, bytes) and len(k) == 32 for t in tables for k in t)


def test_compiles_in_threads_never_fork_a_child_that_hangs(tok):
    """A child forked while another thread is inside llguidance's compile inherits its locks and hangs (about one
    compile in 100 with six threads): compiles here and forks take one lock (bounded.COMPILING)."""
    import threading

    L.set_limits(time_s=8.0)
    failures, stop = [], time.monotonic() + 6

    def compile_many(i: int) -> None:
        n = 0
        while time.monotonic() < stop:
            n += 1
            schema = {"type": "object", "properties": {f"p{i}_{n}_{k}": {"type": "string"} for k in range(4)}}
            try:
                make(tok, "json", schema).mask()
            except ConstraintError as e:
                failures.append(str(e)[:200])

    threads = [threading.Thread(target=compile_many, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def slow(real):
    def run(*args, **kwargs):
        time.sleep(30)
        return real(*args, **kwargs)
    return run


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_a_tool_call_compile_past_the_time_limit_ends_at_it(tok, monkeypatch):
    """The tool-call grammar's parts (each tool's parameter schema, then the grammar) compile under the compile
    limits, as every constraint: past `time_s` the compile ends with a ConstraintError naming the limit."""
    from specstruct.constraints.llguidance import grammar, json_schema
    from specstruct.constraints.tools.grammar import tool_grammar

    L.set_limits(time_s=1.0)
    # parameters no earlier test (nor run) prepared: prepared ones are cached by their text
    fresh = {"type": "object", "properties": {f"city_{uuid.uuid4().hex}": {"type": "string"}}}
    tools = [{**t, "function": {**t["function"], "name": "slow_schema", "parameters": fresh}} for t in TOOLS]
    monkeypatch.setattr(json_schema, "_grammar", slow(json_schema._grammar))
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="too complex") as e:
        tool_grammar(tools, "required", tok)
    assert time.monotonic() - start < 2.0
    assert "'slow_schema'" in str(e.value) and "limit time_s=1.0" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.undo()

    lark = tool_grammar(tools, "required", tok)  # its parameters prepared now (unbounded by the patch below)
    monkeypatch.setattr(grammar, "build_matcher", slow(grammar.build_matcher))
    start = time.monotonic()
    message = refused(tok, "grammar", lark, "time_s", within=2.0)
    assert time.monotonic() - start > 0.9 and "tool-call grammar" in message
    monkeypatch.undo()
    call = '<tool_call>\n{"name": "slow_schema", "arguments": {"%s": "Oslo"}}\n</tool_call>' % next(iter(fresh["properties"]))
    assert make(tok, "grammar", lark).accepts(call)  # the next compile of it goes through
    assert make(tok, "grammar", lark).accepts(call)  # (and the one after from the compiled template)


def test_the_check_before_a_model_loads_is_bounded_too(monkeypatch):
    """check_spec (the CLI's check of a schema before any model loads) runs llguidance's compile in a child too."""
    from specstruct.constraints.compiler import check_spec
    from specstruct.constraints.llguidance import json_schema

    L.set_limits(time_s=1.0)
    monkeypatch.setattr(json_schema, "_grammar", slow(json_schema._grammar))
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="limit time_s=1.0"):
        check_spec(ConstraintSpec("json", json.dumps({"type": "integer"})))
    assert time.monotonic() - start < 2.0
    monkeypatch.undo()
    with pytest.raises(ConstraintError, match="'not'"):  # its errors are the same as in-process
        check_spec(ConstraintSpec("json", json.dumps({"type": "string", "not": {"pattern": "^x"}})))
    check_spec(ConstraintSpec("json", json.dumps({"type": "integer"})))


def test_the_grammar_probe_keeps_digests_within_a_byte_budget():
    """However many and however large the grammars, the probe's tables hold a bounded number of 32-byte digests."""
    import sys

    from specstruct.constraints.llguidance import grammar_probe

    big = "x" * 100_000
    for i in range(3000):
        grammar_probe.trust(f"start: \"{i}\"\n# {big}")
        grammar_probe._passed(grammar_probe.digest("key", f"{i}{big}"))
    tables = (grammar_probe._PASSED, grammar_probe._REFUSED, grammar_probe._TRUSTED)
    held = sum(sys.getsizeof(t) + sum(sys.getsizeof(k) for k in t) for t in tables)
    assert held < 512 * 1024, held  # 2 x 1,024 digests and their dicts; the sources were 300 MB
    assert len(grammar_probe._TRUSTED) <= 1024 and len(grammar_probe._PASSED) <= 1024
