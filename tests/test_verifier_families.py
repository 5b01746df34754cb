"""Validation of proposals and judgement of answers for the three families, run through the real
sandbox; property tests check that the judges agree with direct evaluation on generated literals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier import Status, Verifier
from verifier.families import judge_answers, validate_proposals, values_equal
from verifier.prompts import Proposal, parse_proposal, student_response, teacher_response
from verifier.tasks import Task, identity_task

SORT_K = "def f(xs, k):\n    return sorted(xs)[:k]"
SQUARE = "def f(n):\n    return n * n"


@pytest.fixture(scope="module")
def verifier():
    v = Verifier(timeout_s=2.0, memory_mb=256, workers=2)
    yield v
    v.close()


def test_validate_io_proposals_computes_outputs_in_the_sandbox(verifier):
    texts = [
        teacher_response("code_o", program=SORT_K, inputs=["[5, 3, 9, 1], 2"]),
        teacher_response("code_o", program="def f(a):\n    return a.missing", inputs=["1"]),
        teacher_response("code_o", program="import os\ndef f(a):\n    return a", inputs=["1"]),
        teacher_response("code_o", program=SQUARE, inputs=["n"]),
        "no answer at all",
        teacher_response("code_o", program="def f(a):\n    while True:\n        pass", inputs=["1"]),
    ]
    out = validate_proposals(verifier, "code_o", [parse_proposal("code_o", t) for t in texts])
    assert out[0].valid and out[0].task == Task("code_o", SORT_K, ["[5, 3, 9, 1], 2"], ["[1, 3]"])
    assert [v.status for v in out[1:]] == [Status.RUNTIME_ERROR, Status.FORBIDDEN, Status.BAD_INPUT, None, Status.TIMEOUT]
    assert not any(v.valid for v in out[1:]) and all(v.reason for v in out[1:])
    assert out[4].reason == "invalid proposal: no <answer> in the response"


def test_validate_code_f_needs_every_input_to_run(verifier):
    good = parse_proposal("code_f", teacher_response("code_f", inputs=["1", "2", "3", "4"], message="squares"), n_inputs=4)
    bad = parse_proposal("code_f", teacher_response("code_f", inputs=["1", "2", "'x'", "4"], message="squares"), n_inputs=4)
    out = validate_proposals(verifier, "code_f", [good, bad], programs=[SQUARE, SQUARE], n_inputs=4)
    assert out[0].valid and out[0].task.outputs == ["1", "4", "9", "16"] and out[0].task.message == "squares"
    assert not out[1].valid and out[1].status is Status.RUNTIME_ERROR and "input 3" in out[1].reason
    with pytest.raises(ValueError, match="programs"):
        validate_proposals(verifier, "code_f", [good], programs=[])
    assert "need 4" in validate_proposals(verifier, "code_f", [Proposal(SQUARE, ["1", "2"], "m")], n_inputs=4)[0].reason


def test_identity_seeds_are_valid_tasks(verifier):
    for family in ("code_o", "code_i", "code_f"):
        seed = identity_task(family)
        proposal = Proposal(seed.program, seed.inputs, seed.message)
        (v,) = validate_proposals(verifier, family, [proposal])
        assert v.valid and v.task.outputs == seed.outputs


def test_judge_code_o_uses_value_equality(verifier):
    task = Task("code_o", SORT_K, ["[5, 3, 9, 1], 3"], ["[1, 3, 5]"])
    answers = ["[1,3,5]", "[1, 3, 5]", "[1, 3]", "(1, 3, 5)", "sorted([5, 3, 1])"]
    out = judge_answers(verifier, [(task, student_response("code_o", a)) for a in answers])
    assert [(j.well_formed, j.correct) for j in out] == [(True, True), (True, True), (True, False), (True, False), (False, False)]
    malformed = judge_answers(verifier, [(task, "[1, 3, 5]")])[0]
    assert not malformed.well_formed and not malformed.correct


def test_judge_code_i_executes_any_input_that_reproduces_the_output(verifier):
    task = Task("code_i", SORT_K, ["[5, 3, 9, 1], 2"], ["[1, 3]"])
    answers = ["[3, 1], 2", "[1, 3, 7], 2", "[9, 9], 2", "[1, 3], 'x'", "__import__('os')"]
    out = judge_answers(verifier, [(task, student_response("code_i", a)) for a in answers])
    assert [j.correct for j in out] == [True, True, False, False, False]
    assert out[3].well_formed and "runtime_error" in out[3].reason
    assert not out[4].well_formed  # not a literal argument list: never executed


def test_judge_code_f_needs_every_hidden_pair(verifier):
    task = Task("code_f", SQUARE, ["1", "2", "3", "4"], ["1", "4", "9", "16"], "squares")
    programs = [
        "def f(n):\n    return n ** 2",
        "def f(n):\n    return {1: 1, 2: 4}.get(n, 0)",  # fits the shown pairs only
        "def f(n):\n    return 9 if n == 3 else 16",  # fits the hidden pairs only: that is enough
        "import os\ndef f(n):\n    return n * n",
        "def g(n):\n    return n",
    ]
    out = judge_answers(verifier, [(task, student_response("code_f", p)) for p in programs])
    assert [j.correct for j in out] == [True, False, True, False, False]
    assert "hidden pair 1" in out[1].reason and "forbidden" in out[3].reason
    assert not out[4].well_formed


def test_judge_reports_bad_items(verifier):
    out = judge_answers(verifier, [("not a task", "x"), (identity_task("code_o"),)])
    assert [j.well_formed for j in out] == [False, False] and all(j.reason for j in out)


_LITERALS = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.integers(0, 9), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(gold=_LITERALS, answer=_LITERALS)
def test_code_o_judge_agrees_with_direct_evaluation(gold, answer):
    task = Task("code_o", "def f(a):\n    return a", [repr(gold)], [repr(gold)])
    (j,) = judge_answers(None, [(task, student_response("code_o", repr(answer)))])  # code_o runs nothing
    assert j.well_formed and j.correct == (answer == gold)
    assert values_equal(repr(answer), repr(gold)) == (answer == gold)


@settings(max_examples=25, deadline=None)
@given(gold=_LITERALS, answers=st.lists(_LITERALS, min_size=1, max_size=4))
def test_code_i_judge_agrees_with_direct_evaluation(verifier, gold, answers):
    program = "def f(a):\n    return [a, type(a).__name__]"
    task = Task("code_i", program, [repr(gold)], [repr([gold, type(gold).__name__])])
    out = judge_answers(verifier, [(task, student_response("code_i", repr(a))) for a in answers])
    for answer, j in zip(answers, out):
        assert j.well_formed and j.correct == ([answer, type(answer).__name__] == [gold, type(gold).__name__])
