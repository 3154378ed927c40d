"""Output types -> what to compile, what to tell the model, how to parse the text back.

    output           resolve(output_type) -> OutputSpec; Regex, Choice, Grammar, Code
    pydantic_schema  Pydantic models and TypedDicts -> JSON schema (as the compiler wants it)
    python_regex     Python `re` patterns -> the compilers' regex dialect
"""
