"""A context-free grammar (Lark syntax, run by llguidance): SQL queries that always parse.

    specstruct pull && python examples/grammar_sql.py
"""

from __future__ import annotations

import argparse

import specstruct as ss

SQL = r"""
start: "SELECT " columns " FROM " NAME where? order? ";"
columns: "*" | NAME (", " NAME)*
where: " WHERE " NAME OP value (" AND " NAME OP value)*
order: " ORDER BY " NAME (" ASC" | " DESC")?
value: NUMBER | STRING
OP: " = " | " > " | " < " | " >= " | " <= "
NAME: /[a-z_][a-z0-9_]{0,30}/
NUMBER: /[0-9]{1,9}/
STRING: /'[^']{0,40}'/
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    engine = ss.SpecStruct.from_pretrained(args.model, draft=None if args.draft == "none" else args.draft)
    schema = "Table people(name text, age int, city text)."
    for question in ["Names of people older than 30, oldest first.", "Everyone living in Paris."]:
        res = engine.run(f"{schema} Write one SQL query: {question}", ss.Grammar(SQL), max_new_tokens=64)
        print(res.value, f"  [{res.stats.new_tokens} tokens, {res.stats.target_forwards} target passes]")


if __name__ == "__main__":
    main()
