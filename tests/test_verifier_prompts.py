"""Prompt builders and parsers of the three task families: round trips, AZR's parsing rules, and
property tests showing the parsers never raise on arbitrary text."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier.prompts import (
    Answer,
    Proposal,
    answer_region,
    parse_answer,
    parse_arguments,
    parse_proposal,
    student_prompt,
    student_response,
    teacher_prompt,
    teacher_response,
)
from verifier.tasks import FAMILIES, Task, identity_task

PROGRAM = "def f(xs, k):\n    return sorted(xs)[:k]"


def test_teacher_prompt_shows_every_reference_and_ends_with_assistant_turn():
    refs = [identity_task("code_o"), Task("code_o", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"])]
    prompt = teacher_prompt("code_o", refs)
    assert prompt.startswith("User: ") and prompt.endswith("Assistant: ")
    assert prompt.count("<ref>") == 2
    assert PROGRAM in prompt and "[3, 1, 2], 2" in prompt and "[1, 2]" in prompt
    assert "output is hard to deduce" in prompt
    assert "input is hard to infer" in teacher_prompt("code_i", refs)


def test_teacher_code_f_prompt_probes_the_first_reference_program():
    prompt = teacher_prompt("code_f", [Task("code_o", PROGRAM, ["[1], 1"], ["[1]"])], n_inputs=4)
    assert PROGRAM in prompt and "Give 4 different inputs" in prompt
    with pytest.raises(ValueError, match="needs one reference"):
        teacher_prompt("code_f", [])
    with pytest.raises(ValueError, match="unknown task family"):
        teacher_prompt("code_x", [])


def test_student_prompts_show_what_each_family_allows():
    t = Task("code_o", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"])
    o = student_prompt(t)
    assert PROGRAM in o and "[3, 1, 2], 2" in o and "[1, 2]" not in o
    i = student_prompt(Task("code_i", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"]))
    assert PROGRAM in i and "[1, 2]" in i and "[3, 1, 2], 2" not in i
    ft = Task("code_f", PROGRAM, ["[5, 4], 1", "[9], 1", "[2, 8], 2", "[7, 6, 5], 1"], ["[4]", "[9]", "[2, 8]", "[5]"], "sorts")
    fp = student_prompt(ft)
    assert PROGRAM not in fp and "sorts" in fp
    assert "[5, 4], 1" in fp and "[9], 1" in fp  # the first half is shown
    assert "[2, 8], 2" not in fp and "[7, 6, 5], 1" not in fp  # the second half stays hidden
    assert ft.hidden_pairs() == [("[2, 8], 2", "[2, 8]"), ("[7, 6, 5], 1", "[5]")]


@pytest.mark.parametrize("family", ["code_o", "code_i"])
def test_proposal_round_trip(family):
    text = teacher_response(family, program=PROGRAM, inputs=["[3, 1, 2], 2"], think="sort then slice")
    assert parse_proposal(family, text) == parse_proposal(family, "Assistant: " + text)
    p = parse_proposal(family, text)
    assert p.error is None and p.program == PROGRAM and p.inputs == ["[3, 1, 2], 2"]


def test_proposal_takes_first_blocks_of_the_last_answer():
    text = (
        "<think>draft <answer>```python\ndef g(): pass\n```</answer></think>\n<answer>\n"
        "```python\ndef f(a):\n    return a + 1\n```\n```input\n1\n```\n```input\n2\n```\n```python\ndef f(a): return 0\n```\n</answer>"
    )
    p = parse_proposal("code_o", text)
    assert p.error is None and p.program == "def f(a):\n    return a + 1" and p.inputs == ["1"]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("no tags at all", "no <answer>"),
        ("<answer>```input\n1\n```</answer>", "no ```python block"),
        ("<answer>```python\ndef f(a): return a\n```</answer>", "no ```input block"),
    ],
)
def test_bad_proposals_name_the_problem(text, reason):
    p = parse_proposal("code_i", text)
    assert p.error is not None and reason in p.error


def test_code_f_proposal_keeps_the_last_n_inputs_and_needs_a_message():
    text = teacher_response("code_f", inputs=["1", "2", "3", "4", "5"], message="adds one")
    p = parse_proposal("code_f", text, program=PROGRAM, n_inputs=4)
    assert p.error is None and p.inputs == ["2", "3", "4", "5"] and p.message == "adds one" and p.program == PROGRAM
    assert "need 6" in parse_proposal("code_f", text, n_inputs=6).error
    no_msg = "<answer>```input\n1\n```\n```input\n2\n```</answer>"
    assert "message" in parse_proposal("code_f", no_msg).error
    tagged = "<answer>```input\n1\n```\n```input\n2\n```\n<message>hint</message></answer>"
    assert parse_proposal("code_f", tagged).message == "hint"


@pytest.mark.parametrize(
    "family, value",
    [("code_o", "[1, 'a', (2.5, None)]"), ("code_i", "'abc', [1, 2], k=3"), ("code_f", "def f(a):\n    return a")],
)
def test_answer_round_trip_is_well_formed(family, value):
    a = parse_answer(family, student_response(family, value, think="because"))
    assert a == Answer(value, None, True) and a.well_formed
    # skipping the reasoning is still well formed
    assert parse_answer(family, student_response(family, value)).well_formed
    assert parse_answer(family, f"<answer>\n{student_response(family, value).split('<answer>')[1]}").well_formed


def test_answer_problems():
    assert not parse_answer("code_o", "the answer is 5").well_formed
    bad = parse_answer("code_o", "<think>x</think><answer>```output\nfoo(1)\n```</answer>")
    assert bad.value == "foo(1)" and "not a Python literal" in bad.error and not bad.well_formed
    assert "argument" in parse_answer("code_i", "<answer>```input\nos.system('x')\n```</answer>").error
    assert "no top-level function f" in parse_answer("code_f", "<answer>```python\ndef g(): return 1\n```</answer>").error
    # no fences: AZR falls back to the whole answer text
    assert parse_answer("code_o", "<think></think><answer> 42 </answer>").value == "42"
    assert parse_answer("code_o", "<answer>```input\n1\n```</answer>").error == "no ```output block in the answer"


def test_parse_arguments_accepts_literals_only():
    assert parse_arguments("'a', [1, {2: (3,)}], k=-1.5") == (["a", [1, {2: (3,)}]], {"k": -1.5})
    assert parse_arguments("") == ([], {})
    for bad in ["__import__('os')", "1,, 2", "[1] * 5", "**{'a': 1}", "x"]:
        with pytest.raises(ValueError):
            parse_arguments(bad)


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(FAMILIES), text=st.text())
def test_parsers_never_raise_on_any_text(family, text):
    proposal = parse_proposal(family, text)
    assert isinstance(proposal, Proposal) and (proposal.error is not None or bool(proposal.inputs))
    assert isinstance(parse_answer(family, text), Answer)


_FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "```", "```python\n", "```input\n", "```output\n",
     "```message\n", "\n", "def f(a):\n    return a\n", "'x'", "[1, (", "<message>", "</message>", " "]
)


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(FAMILIES), parts=st.lists(st.one_of(_FRAGMENTS, st.text(max_size=5)), max_size=20))
def test_parsers_never_raise_on_tag_soup(family, parts):
    text = "".join(parts)
    proposal = parse_proposal(family, text, program="def f(a): return a", n_inputs=2)
    assert proposal.error is None or isinstance(proposal.error, str)
    answer = parse_answer(family, text)
    assert answer.well_formed == (answer.layout_ok and answer.value is not None and answer.error is None)


_LITERALS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(value=_LITERALS)
def test_parsed_output_answers_are_the_literal(value):
    a = parse_answer("code_o", student_response("code_o", repr(value)))
    assert a.well_formed and ast.literal_eval(a.value) == value


def test_task_dict_round_trip_and_errors():
    t = Task("code_f", PROGRAM, ["[1], 1", "[2], 1"], ["[1]", "[2]"], "m")
    assert Task.from_dict(t.to_dict()) == t
    with pytest.raises(ValueError, match="unknown task family"):
        Task("code_z", PROGRAM, ["1"], ["1"])
    with pytest.raises(ValueError, match="exactly 1"):
        Task("code_o", PROGRAM, ["1", "2"], ["1", "2"])
    with pytest.raises(ValueError, match="unknown Task keys"):
        Task.from_dict({**t.to_dict(), "extra": 1})
    # the last complete answer wins over a stray, unclosed <answer> after it (e.g. a response cut at max_tokens)
    assert answer_region("a<answer>b</answer>c<answer>d") == "b"
    assert answer_region("a<answer>b</answer>c<answer>d</answer>") == "d"
    assert answer_region("<answer>x <answer>y</answer>") == "y"
    assert answer_region("thinking<answer>unclosed") == "unclosed" and answer_region("none") is None
