"""Readers for the benchmark files users already have, in their standard layouts.

Which layout a file has is found from its fields (``detect_layout``); a row that does not fit
raises :class:`BenchmarkFileError` naming the file and the line. Layouts (facts in
``docs/evaluation.md``):

- ``evalplus``: HumanEval+ / MBPP+ release rows (``task_id``, ``prompt``, ``entry_point``,
  ``canonical_solution``, ``base_input``, ``plus_input``, ``atol``); MBPP+ inputs are deserialised
  per task (``mbpp_deserialize``) because JSON cannot hold their tuples, sets and complex numbers.
- ``check``: a self-contained ``test`` defining ``check(candidate)`` (openai HumanEval, and the
  "original format" HumanEval+ copies).
- ``mbpp_asserts``: MBPP-style rows with ``code``, ``test_list`` (assert lines), ``test_imports``.
- ``livecodebench``: ``code_generation_lite`` rows; private tests are JSON or base64(zlib(pickle(JSON
  string))), unpickled by :class:`_StringOnlyUnpickler`, which can build nothing but a ``str``.
- ``math``: MATH-500, Minerva, GSM8K (``####``), AIME, AMC, OlympiadBench JSONL.

Nothing here writes to the data directory.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import pickle
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from evaluation.references import file_digest

CODE_BENCHMARKS = ("humaneval+", "mbpp+", "humaneval", "mbpp", "livecodebench")
MATH_BENCHMARKS = ("math500", "gsm8k", "aime24", "aime25", "amc23", "minerva", "olympiadbench")
BENCHMARKS = CODE_BENCHMARKS + MATH_BENCHMARKS

# Where a benchmark's file is looked for under --data DIR (first match wins); ``name=PATH`` overrides.
FILE_PATTERNS: dict[str, tuple[str, ...]] = {
    "humaneval+": ("HumanEvalPlus*.jsonl*", "humanevalplus*.jsonl*", "humaneval+*.jsonl*", "humaneval+/*.jsonl*"),
    "mbpp+": ("MbppPlus*.jsonl*", "mbppplus*.jsonl*", "mbpp+*.jsonl*", "mbpp+/*.jsonl*"),
    "humaneval": ("HumanEval.jsonl*", "humaneval.jsonl*", "humaneval/*.jsonl*"),
    "mbpp": ("mbpp.jsonl*", "Mbpp.jsonl*", "mbpp/*.jsonl*"),
    "livecodebench": ("livecodebench/test*.jsonl", "code_generation_lite/test*.jsonl", "livecodebench*.jsonl"),
}
for _name in MATH_BENCHMARKS:
    FILE_PATTERNS[_name] = (f"{_name}/test.jsonl", f"{_name}.jsonl", f"{_name}/*.jsonl")


class BenchmarkFileError(ValueError):
    """A benchmark file, or one of its rows, that no reader understands (the message names file and line)."""


@dataclass
class CodeProblem:
    """One code task. ``prompt`` is the task as shown to the model; ``prefix`` is code the candidate is
    appended to (HumanEval's signature and imports); ``reference`` a complete reference program."""

    benchmark: str
    task_id: str
    layout: str
    prompt: str
    source: str
    entry_point: str = ""
    prefix: str = ""
    reference: str | None = None
    base_inputs: list[Any] = field(default_factory=list)  # evalplus: argument lists, deserialised
    plus_inputs: list[Any] = field(default_factory=list)
    atol: float = 0.0
    test: str = ""  # check layout: the test code; mbpp_asserts: imports and asserts
    tests: list[dict[str, str]] = field(default_factory=list)  # livecodebench: public + private
    func_name: str = ""  # livecodebench functional tests
    starter_code: str = ""
    file_digest: str = ""  # sha256 of the benchmark file (the reference cache's key)

    @property
    def inputs(self) -> list[Any]:
        """Every argument list: base then plus."""
        return self.base_inputs + self.plus_inputs


@dataclass
class MathProblem:
    benchmark: str
    task_id: str
    layout: str
    question: str
    answer: str
    source: str


Problem = CodeProblem | MathProblem


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) for every non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise BenchmarkFileError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise BenchmarkFileError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
                yield number, row
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        if isinstance(exc, BenchmarkFileError):
            raise
        raise BenchmarkFileError(f"{path}: cannot be read as JSONL ({exc})") from None


def detect_layout(row: dict[str, Any]) -> str | None:
    """The layout a row's fields say it has, or None."""
    keys = set(row)
    if {"task_id", "prompt", "entry_point", "canonical_solution", "base_input", "plus_input"} <= keys:
        return "evalplus"
    if {"task_id", "prompt", "entry_point", "canonical_solution", "test"} <= keys:
        return "check"
    if {"code", "test_list"} <= keys and ("prompt" in keys or "text" in keys):
        return "mbpp_asserts"
    if {"question_content", "public_test_cases", "private_test_cases", "metadata"} <= keys:
        return "livecodebench"
    if "final_answer" in keys and "question" in keys:
        return "math:olympiad"
    if {"question", "answer"} <= keys and isinstance(row["answer"], str) and "####" in row["answer"]:
        return "math:gsm8k"
    if "answer" in keys and ("problem" in keys or "question" in keys):
        return "math:answer"
    if {"problem", "solution"} <= keys:
        return "math:boxed_solution"
    return None


FAMILY = {"evalplus": "code", "check": "code", "mbpp_asserts": "code", "livecodebench": "code"}


def _need(row: dict[str, Any], where: str, *names: str, kind: type | tuple[type, ...] = str) -> None:
    for name in names:
        if name not in row:
            raise BenchmarkFileError(f"{where}: row lacks the field {name!r}")
        if not isinstance(row[name], kind):
            raise BenchmarkFileError(f"{where}: field {name!r} should be {getattr(kind, '__name__', kind)}, got {type(row[name]).__name__}")


def find_file(data_dir: Path, benchmark: str) -> list[Path]:
    """The benchmark's file(s) under ``data_dir`` (livecodebench: every ``test*.jsonl`` of the release)."""
    if benchmark not in FILE_PATTERNS:
        raise BenchmarkFileError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    for pattern in FILE_PATTERNS[benchmark]:
        found = sorted(p for p in data_dir.glob(pattern) if p.is_file())
        if found:
            return found if benchmark == "livecodebench" else found[:1]
    raise BenchmarkFileError(
        f"no file for {benchmark!r} under {data_dir} (looked for {', '.join(FILE_PATTERNS[benchmark])}); "
        f"name it that way or pass {benchmark}=PATH"
    )


def load_benchmark(benchmark: str, paths: list[Path]) -> list[Problem]:
    """Every problem of ``benchmark`` from ``paths``, each row read by the layout its fields show."""
    problems: list[Problem] = []
    want = "math" if benchmark in MATH_BENCHMARKS else "code"
    for path in paths:
        digest = file_digest(path) if path.is_file() else ""
        for number, row in read_jsonl(path):
            task = row.get("task_id", row.get("question_id"))
            where = f"{path}:{number}" + (f" (task {task})" if isinstance(task, (str, int)) else "")
            layout = detect_layout(row)
            if layout is None:
                raise BenchmarkFileError(
                    f"{where}: fields {sorted(row)[:12]} match no known benchmark layout "
                    "(evalplus, HumanEval check(candidate), MBPP asserts, LiveCodeBench, or a math set)"
                )
            family = "math" if layout.startswith("math:") else "code"
            if family != want:
                raise BenchmarkFileError(f"{where}: {benchmark} is a {want} benchmark but this row is a {family} row ({layout})")
            problem = _READERS[layout.split(":")[0]](benchmark, layout, row, where, len(problems))
            if isinstance(problem, CodeProblem):
                problem.file_digest = digest
            problems.append(problem)
    if not problems:
        raise BenchmarkFileError(f"{', '.join(map(str, paths))}: no rows")
    return problems


def _evalplus(benchmark: str, layout: str, row: dict[str, Any], where: str, index: int) -> CodeProblem:
    _need(row, where, "task_id", "prompt", "entry_point", "canonical_solution")
    _need(row, where, "base_input", "plus_input", kind=list)
    task_id = row["task_id"]
    parts: dict[str, list[Any]] = {}
    for part in ("base_input", "plus_input"):
        inputs = list(row[part])
        for k, args in enumerate(inputs):
            if not isinstance(args, list):
                raise BenchmarkFileError(f"{where}: {part}[{k}] is not an argument list")
        if task_id.lower().startswith("mbpp/"):
            try:
                inputs = mbpp_deserialize(task_id, inputs)
            except (TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
                raise BenchmarkFileError(f"{where}: {part} cannot be deserialised ({type(exc).__name__}: {exc})") from None
        parts[part] = inputs
    mbpp = task_id.lower().startswith("mbpp/")
    prompt, solution = row["prompt"], row["canonical_solution"]
    atol = row.get("atol") or 0.0
    if not isinstance(atol, (int, float)):
        raise BenchmarkFileError(f"{where}: atol should be a number, got {atol!r}")
    return CodeProblem(
        benchmark, task_id, layout, prompt, where, entry_point=row["entry_point"],
        prefix="" if mbpp else prompt, reference=prompt + solution,
        base_inputs=parts["base_input"], plus_inputs=parts["plus_input"], atol=float(atol),
    )


def _check(benchmark: str, layout: str, row: dict[str, Any], where: str, index: int) -> CodeProblem:
    _need(row, where, "task_id", "prompt", "entry_point", "canonical_solution", "test")
    if "def check" not in row["test"]:
        raise BenchmarkFileError(f"{where}: the test of {row['task_id']} defines no check(candidate)")
    prompt = row["prompt"]
    return CodeProblem(benchmark, row["task_id"], layout, prompt, where, entry_point=row["entry_point"], prefix=prompt,
                       reference=prompt + row["canonical_solution"], test=row["test"])


def _mbpp_asserts(benchmark: str, layout: str, row: dict[str, Any], where: str, index: int) -> CodeProblem:
    _need(row, where, "code")
    _need(row, where, "test_list", kind=list)
    asserts = [t for t in row["test_list"] if isinstance(t, str)]
    if not asserts or len(asserts) != len(row["test_list"]):
        raise BenchmarkFileError(f"{where}: test_list should be a non-empty list of assert lines")
    imports = row.get("test_imports") or []
    text = row.get("prompt") or row.get("text") or ""
    prompt = f'"""\n{text.strip()}\n{asserts[0]}\n"""\n' if "assert" not in text else text
    test = "\n".join(list(imports) + asserts)
    return CodeProblem(benchmark, str(row.get("task_id", index)), layout, prompt, where, reference=row["code"], test=test)


class _StringOnlyUnpickler(pickle.Unpickler):
    """An unpickler that builds no object but the basic ones pickle makes without a class lookup
    (``str``, numbers, lists, dicts): any global it would have to find is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: private tests are only a string")


def decode_private_tests(text: str, where: str) -> list[dict[str, Any]]:
    """LiveCodeBench ``private_test_cases``: JSON, or base64 of zlib of a pickle of that JSON string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=False))
            value = _StringOnlyUnpickler(io.BytesIO(raw)).load()
            if isinstance(value, (bytes, bytearray)):
                value = value.decode("utf-8")
            if not isinstance(value, str):
                raise pickle.UnpicklingError(f"the pickle holds a {type(value).__name__}, not a JSON string")
            value = json.loads(value)
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, UnicodeError) as exc:
            raise BenchmarkFileError(f"{where}: private_test_cases is neither JSON nor base64(zlib(pickle)) ({exc})") from None
    return _test_list(value, where, "private_test_cases")


def _test_list(value: Any, where: str, name: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(
        isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
        and t.get("testtype") in ("stdin", "functional") for t in value
    ):
        raise BenchmarkFileError(f"{where}: {name} should be a list of {{input, output, testtype: stdin|functional}}")
    return value


def _livecodebench(benchmark: str, layout: str, row: dict[str, Any], where: str, index: int) -> CodeProblem:
    _need(row, where, "question_content", "public_test_cases", "private_test_cases", "metadata")
    try:
        public = _test_list(json.loads(row["public_test_cases"]), where, "public_test_cases")
        metadata = json.loads(row["metadata"] or "{}")
    except json.JSONDecodeError as exc:
        raise BenchmarkFileError(f"{where}: public_test_cases / metadata is not JSON ({exc.msg})") from None
    private = decode_private_tests(row["private_test_cases"], where) if row["private_test_cases"] else []
    func_name = metadata.get("func_name", "") if isinstance(metadata, dict) else ""
    tests = public + private
    if not tests:
        raise BenchmarkFileError(f"{where}: no tests")
    if any(t["testtype"] == "functional" for t in tests) and not func_name:
        raise BenchmarkFileError(f"{where}: functional tests but metadata has no func_name")
    task_id = str(row.get("question_id") or row.get("question_title") or index)
    return CodeProblem(benchmark, task_id, layout, row["question_content"], where, tests=tests, func_name=func_name,
                       starter_code=row.get("starter_code") or "", reference=row.get("reference_solution"))


BOXED = "\\boxed"


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` (braces balanced) in ``text``, or None."""
    start = text.rfind(BOXED)
    while start >= 0:
        i = start + len(BOXED)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
                j += 1
        start = text.rfind(BOXED, 0, start)
    return None


def _number_text(value: Any) -> str:
    """An answer as text; integral floats (AMC's ``27.0``) become integers."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _math(benchmark: str, layout: str, row: dict[str, Any], where: str, index: int) -> MathProblem:
    kind = layout.split(":")[1]
    question = row.get("problem", row.get("question"))
    if not isinstance(question, str) or not question.strip():
        raise BenchmarkFileError(f"{where}: the question (problem / question) is missing or empty")
    if kind == "gsm8k":
        answer = row["answer"].split("####")[-1].strip().replace(",", "")
    elif kind == "olympiad":
        final = row["final_answer"]
        answer = final[0] if isinstance(final, list) and final else final
        if not isinstance(answer, str):
            raise BenchmarkFileError(f"{where}: final_answer should be a list of strings")
        answer = answer.strip().strip("$").strip()
    elif kind == "answer":
        answer = _number_text(row["answer"])
    else:
        boxed = last_boxed(str(row["solution"]))
        if boxed is None:
            raise BenchmarkFileError(f"{where}: no answer field and no \\boxed{{}} in the solution")
        answer = boxed
    if not str(answer).strip():
        raise BenchmarkFileError(f"{where}: empty answer")
    task_id = str(row.get("unique_id") or row.get("id") or row.get("idx") or index)
    return MathProblem(benchmark, task_id, layout, question, str(answer).strip(), where)


_READERS = {"evalplus": _evalplus, "check": _check, "mbpp_asserts": _mbpp_asserts, "livecodebench": _livecodebench, "math": _math}


# -- MBPP+ argument types ------------------------------------------------------------------------
# Facts from evalplus's mbpp_deserialize_inputs: which MBPP+ task numbers carry tuples, sets or
# complex numbers that the JSON file stores as lists and strings.
_TUPLE_ARGS = frozenset({2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740, 744, 809})
_TUPLE_ITEMS_OF_ARGS = frozenset({63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780})
_FIRST_ARG_ITEMS = frozenset({75, 413, 444, 753})
_SECOND_ARG = frozenset({106, 750})
_FIRST_ARG = frozenset({250, 405, 446, 617, 720, 763, 808})
_NESTED_THEN_ARGS = frozenset({259, 401, 445})
_DEEP = frozenset({580, 615, 791})


def _deep_tuple(value: Any) -> Any:
    return tuple(_deep_tuple(v) for v in value) if isinstance(value, list) else value


def mbpp_deserialize(task_id: str, inputs: list[list[Any]]) -> list[Any]:
    """MBPP+ argument lists with their real Python types restored (per task number, see above)."""
    number = int(re.sub(r"\D", "", task_id.split("/")[-1]) or -1)
    if number in _TUPLE_ARGS:
        return [[tuple(a) for a in args] for args in inputs]
    if number in _TUPLE_ITEMS_OF_ARGS:
        return [[[tuple(x) for x in a] for a in args] for args in inputs]
    if number in _FIRST_ARG_ITEMS:
        return [[[tuple(x) for x in args[0]], args[1]] for args in inputs]
    if number in _SECOND_ARG:
        return [[args[0], tuple(args[1])] for args in inputs]
    if number == 115:
        return [[[set(x) if isinstance(x, list) and x else {} for x in args[0]]] for args in inputs]
    if number == 124:
        return [[float(args[0]), complex(args[1])] for args in inputs]
    if number in _FIRST_ARG:
        return [[tuple(args[0]), args[1]] for args in inputs]
    if number in _NESTED_THEN_ARGS:
        return [[tuple(tuple(x) for x in a) for a in args] for args in inputs]
    if number == 278:
        return [[tuple(tuple(x) if isinstance(x, list) else x for x in args[0])] for args in inputs]
    if number == 307:
        return [[tuple(args[0]), args[1], args[2]] for args in inputs]
    if number == 722:
        return [[{k: tuple(v) for k, v in args[0].items()}, *args[1:]] for args in inputs]
    if number == 252:
        return [[complex(args[0])] for args in inputs]
    if number in _DEEP:
        return [list(_deep_tuple(args)) for args in inputs]
    return inputs
