"""The llguidance backend (the default for JSON, and for Lark grammars and tool calls).

    json_schema     JSON schemas through llguidance's JSON compiler
    schema_text     a schema as this backend compiles it, from a Pydantic type or a dict
    grammar         llguidance matchers -> GrammarConstraint
    grammar_probe   what a grammar accepts, checked before it runs
    grammar_worker  a user's grammar compiled and kept in a killable child process, each call bounded in time
    bounded         one compile in a forked child under the compile limits (time, memory)
"""
