"""The outlines_core backend: regexes (and JSON schemas as regexes) -> token automata.

    regexes        JSON schema / choice -> regex (json_backend="outlines")
    isolate        Index builds in a bounded worker process (_index_worker.py)
    token_table    the tokenizer's vocabulary as bytes (shared with llguidance)
    automaton      Index -> AutomatonConstraint / FreeTextConstraint (masks, fork, rollback)
"""
