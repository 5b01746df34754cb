"""Per-line execution traces (``tinycoder.line_trace``): the instrumented program runs in the real sandbox and
returns the state after every executed line; the rendered trace is bounded; the examples of a traced mix carry it;
a continuation may train on such examples with the tokenizer of the model it continues."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from tinycoder import build_here, model_dir
from tinycoder.cache import MANIFEST
from tinycoder.corpus import build_corpus, draw_programs
from tinycoder.examples import ExampleMix, ExampleWriter
from tinycoder.line_trace import ELIDED, MAX_EVENTS, instrument, line_traces, render, step_counts
from tinycoder.liveness import dead_code
from tinycoder.settings import VARIANTS, continued_settings, describe
from tinycoder.task_sets import trained_programs
from verifier.families import judge_answers
from verifier.prompts import student_response
from verifier.sandbox import ExecResult, Status, Verifier
from verifier.tasks import Task
from test_tinycoder_build import MICRO

LOOP = """def f(nums):
    total = 0
    for x in nums:
        if x > 1:
            total += x * 2
    return total
"""

HELPER_AND_DICT = """def f(words):
    def g(v):
        w = v + 1
        return w
    d = {}
    for w in words:
        d[w] = d.get(w, 0) + g(1)
    letters = []
    letters.append(len(d))
    return letters
"""


@pytest.fixture(scope="module")
def verifier():
    with Verifier(timeout_s=2.0, memory_mb=256, max_output_chars=8000) as v:
        yield v


def test_a_trace_is_the_state_after_every_executed_line(verifier):
    [trace] = line_traces(verifier, [(LOOP, "[1, 2, 3]")], budget=1000)
    assert trace == ("total = 0", "x = 1", "x = 2", "total = 4", "x = 3", "total = 10")


def test_a_helper_is_one_step_and_a_subscript_or_a_mutating_call_shows_its_variable(verifier):
    [trace] = line_traces(verifier, [(HELPER_AND_DICT, "['a', 'b', 'a']")], budget=1000)
    assert trace == ("d = {}", "w = 'a'", "d = {'a': 2}", "w = 'b'", "d = {'a': 2, 'b': 2}", "w = 'a'",
                     "d = {'a': 4, 'b': 2}", "letters = []", "letters = [2]")


def test_the_instrumented_program_keeps_the_programs_behaviour(verifier):
    """The events end where the original returns: an early return leaves the rest untraced; no event, no line."""
    early = "def f(n):\n    if n < 0:\n        return 0\n    k = n + 1\n    return k\n"
    traces = line_traces(verifier, [(early, "-3"), (early, "4"), ("def f(s):\n    return s.split()\n", "'a b'")], budget=1000)
    assert traces == [(), ("k = 5",), ()]


def test_a_long_trace_is_cut_to_its_budget_and_elided(verifier):
    [full] = line_traces(verifier, [(LOOP, str(list(range(40))))], budget=10_000)
    [cut] = line_traces(verifier, [(LOOP, str(list(range(40))))], budget=40)
    assert cut[-1] == ELIDED and cut[:-1] == full[:len(cut) - 1]
    assert sum(len(line) + 1 for line in cut[:-1]) <= 40
    assert full[-1] == ELIDED and len(full) == MAX_EVENTS, "the program stops recording at MAX_EVENTS, said by '...'"


@pytest.mark.parametrize("output", ["[('x', '1'), ('y',)]", "{'x': '1'}", "[('x', 2)]", "[('x', '1')] + []", "[" * 500])
def test_a_run_whose_output_is_not_a_list_of_pairs_gives_no_trace(output):
    assert render(ExecResult(Status.OK, output, "", 0.0), 1000) == ()
    assert render(ExecResult(Status.TIMEOUT, None, "timed out", 2.0), 1000) == ()


def test_only_a_single_top_level_f_is_instrumented():
    assert instrument("def g(x):\n    return x\n") is None
    assert instrument("import os\ndef f(x):\n    return x\n") is None
    assert instrument("def f(x):\n    return (\n") is None


def test_a_traced_mix_writes_the_line_trace_in_the_code_o_students_think(verifier):
    corpus = build_corpus(verifier, replace(MICRO.corpus, programs=60), 3)
    lines = dict(zip((item.program.source for item in corpus),
                     line_traces(verifier, [(item.program.source, item.inputs[0]) for item in corpus], 200)))
    mix = ExampleMix(p_correct=1.0, student_trace="lines", student_o=1.0)
    examples = ExampleWriter(corpus, mix, random.Random(0), lines).all_examples()
    students = [e for e in examples if e.role == "student" and e.family == "code_o"]
    assert len(students) == len(corpus)
    traced = 0
    for example, item in zip(students, corpus):
        think = example.completion.split("<think>", 1)[1].split("</think>", 1)[0]
        assert think.split("\n")[:-1] == list(lines[item.program.source])
        traced += bool(lines[item.program.source])
    assert traced >= len(corpus) // 3
    with pytest.raises(ValueError, match="needs the programs' line traces"):
        ExampleWriter(corpus, mix, random.Random(0))
    with pytest.raises(ValueError, match="student_trace must be one of"):
        ExampleMix(student_trace="words")


def test_a_students_trace_is_never_run_and_a_malformed_one_does_not_change_the_verdict(verifier, tmp_path):
    """A trace is model output in <think>: the judge reads the answer only, bounded, and runs nothing of the trace."""
    task = Task("code_o", LOOP, ["[1, 2, 3]"], ["10"])
    owned = tmp_path / "owned"
    hostile = f"total = __import__('os').system('touch {owned}')\n" + "[" * 10_000 + "\nx = ...\n"
    right, wrong = judge_answers(verifier, [(task, student_response("code_o", "10", think=hostile)),
                                            (task, student_response("code_o", "11", think=hostile))])
    assert right.well_formed and right.correct and not wrong.correct
    assert not owned.exists()


@pytest.fixture
def traced_micro(monkeypatch):
    monkeypatch.setitem(VARIANTS, "micro", MICRO)
    monkeypatch.setitem(VARIANTS, "micro-traced", replace(
        MICRO, continues="micro", mix=replace(MICRO.mix, student_trace="lines", live_only=True),
        corpus=replace(MICRO.corpus, programs=30), train=replace(MICRO.train, steps=2)))


def test_a_continuation_trains_on_traced_examples_with_the_tokenizer_of_the_model_it_continues(tmp_path, traced_micro):
    child = build_here("micro-traced", cache_dir=tmp_path, threads=1, progress=False)
    parent = model_dir("micro", cache_dir=tmp_path)
    from transformers import AutoTokenizer

    mine, its = AutoTokenizer.from_pretrained(child), AutoTokenizer.from_pretrained(parent)
    assert mine.get_vocab() == its.get_vocab()
    assert mine(LOOP + "total = 10\nx = 3")["input_ids"] == its(LOOP + "total = 10\nx = 3")["input_ids"]
    assert json.loads((child / MANIFEST).read_text())["continues"]["variant"] == "micro"
    assert trained_programs(child) >= {program.source for program, _ in draw_programs(MICRO.corpus, random.Random(0))}, \
        "the programs of the model it continues are not held out either"
    seeds = [json.loads(line)["program"] for line in (child / "tasks.jsonl").read_text().splitlines()]
    assert seeds and all(dead_code(program) == [] for program in seeds), "live_only: no example or seed task has dead code"


@pytest.mark.parametrize("corpus", [replace(MICRO.corpus, programs=41), replace(MICRO.corpus, min_inputs=3)])
def test_a_continuations_corpus_is_a_prefix_of_its_parents_drafts(traced_micro, corpus):
    with pytest.raises(ValueError, match="these differ: corpus"):
        describe(replace(VARIANTS["micro-traced"], corpus=corpus), 0)
    assert continued_settings(VARIANTS["micro-traced"]) == MICRO


@pytest.mark.parametrize("source, dead", [
    ("def f(words, nums):\n    parts = [w * x for w, x in zip(words, nums)]\n    letters = []\n"
     "    for w in words:\n        if w in 'abc':\n            letters.append(w)\n        elif letters:\n"
     "            letters.pop()\n    return letters\n", ["parts"]),
    ("def f(nums):\n    def g(v):\n        return g(v - 1) if v > 0 else 0\n    return [x + 1 for x in nums]\n", ["g"]),
    ("def f(nums):\n    def g(v):\n        return v + 1\n    return [g(x) for x in nums]\n", []),
    (LOOP, []),
    (HELPER_AND_DICT, []),
    # a name read only by a condition around a live statement, or by a loop's iterable, is live
    ("def f(nums, n):\n    limit = n * 2\n    picked = [x for x in nums if x > 0]\n    total = 0\n"
     "    for x in picked:\n        if x < limit:\n            total += x\n    return total\n", []),
    ("def f(nums):\n    count = 0\n    total = 0\n    for x in nums:\n        count += 1\n        total += x\n"
     "    return total\n", ["count"]),
    ("def f(n):\n    k = n + 1\n    if k > 3:\n        return 1\n    return 0\n", []),
])
def test_dead_code_is_what_the_return_value_never_depends_on(source, dead):
    assert dead_code(source) == dead


def test_dead_code_needs_a_single_top_level_f():
    assert dead_code("def g(x):\n    return x\n") is None and dead_code("def f(:\n") is None


def test_step_counts_are_the_events_a_line_by_line_reader_passes_through(verifier):
    counts = step_counts(verifier, [(LOOP, "[1, 2, 3]"), (LOOP, "[]"), (LOOP, str(list(range(40)))),
                                    ("def f(s):\n    return s.split()\n", "'a b'"), ("import os\n", "1")])
    assert counts == [6, 1, MAX_EVENTS, 0, None]
