"""Training examples: the project's exact prompt formats, answers right only part of the time."""

from __future__ import annotations

import ast
import random
from collections import Counter

import pytest

from tinycoder.corpus import CorpusSettings, build_corpus
from tinycoder.examples import ExampleMix, ExampleWriter, value_type
from tinycoder.wrong_answers import perturb_value, wrong_output, wrong_program
from verifier import parse_answer, parse_proposal
from verifier.prompts import ASSISTANT
from verifier.sandbox import Status, Verifier


@pytest.fixture(scope="module")
def corpus():
    with Verifier(timeout_s=2.0) as verifier:
        return build_corpus(verifier, CorpusSettings(programs=80, inputs_per_program=4, min_inputs=3), seed=3)


def test_every_role_family_pair_in_the_project_format(corpus):
    examples = ExampleWriter(corpus, ExampleMix(), random.Random(0)).all_examples()
    pairs = Counter((e.role, e.family) for e in examples)
    assert set(pairs) == {(r, f) for r in ("teacher", "student") for f in ("code_o", "code_i", "code_f")}
    sources = {item.program.source.strip("\n") for item in corpus}
    for e in examples:
        assert e.prompt.startswith("User: ") and e.prompt.endswith(ASSISTANT)
        assert e.completion.startswith("<think>") and e.completion.rstrip().endswith("</answer>")
        if e.role == "teacher":
            proposal = parse_proposal(e.family, e.completion)
            assert proposal.error is None, (proposal.error, e.completion)
            if e.family == "code_f":
                assert len(proposal.inputs) >= 2 and proposal.message.startswith("Given ")
            else:
                assert proposal.program.strip("\n") in sources
        else:
            answer = parse_answer(e.family, e.completion)
            assert answer.well_formed, (answer.error, e.completion)


def test_students_are_right_about_p_correct_of_the_time_and_the_verifier_agrees(corpus):
    mix = ExampleMix(p_correct=0.6)
    writer = ExampleWriter(corpus, mix, random.Random(1))
    students = [writer.student(fam, item) for item in corpus for fam in ("code_o", "code_i")]
    share = sum(e.correct for e in students) / len(students)
    assert 0.5 < share < 0.7
    with Verifier(timeout_s=2.0) as verifier:
        agree = 0
        for e in students[:60]:
            answer = parse_answer(e.family, e.completion).value
            program = e.prompt.split("```python\n", 1)[1].split("\n```", 1)[0]
            gold = e.prompt.split(f"```{'input' if e.family == 'code_o' else 'output'}\n", 1)[1].split("\n```", 1)[0]
            if e.family == "code_o":
                # gold here is the input: run it to get the true output, then compare values.
                truth = verifier.execute(program, gold)
                right = truth.status is Status.OK and ast.literal_eval(truth.output) == ast.literal_eval(answer)
            else:
                run = verifier.execute(program, answer)
                right = run.status is Status.OK and ast.literal_eval(run.output) == ast.literal_eval(gold)
            if e.correct:
                assert right, e.completion
            agree += right == e.correct
        # A "wrong" code_i input can happen to give the same output; nearly all do not.
        assert agree >= 0.9 * 60


def test_wrong_outputs_keep_the_type_and_differ():
    rng = random.Random(2)
    for value in [0, 7, -3, True, "", "abc", [], [1, 2], ["a", "b"], {"a": 1}, {}, (1, "x"), None]:
        for _ in range(5):
            text = wrong_output(repr(value), rng)
            changed = ast.literal_eval(text)
            assert changed != value or type(changed) is not type(value)
            if value is not None and not isinstance(value, bool):
                assert type(changed) is type(value), (value, changed)
    assert perturb_value(True, rng) is False


def test_wrong_program_still_defines_f_and_differs():
    rng = random.Random(4)
    program = "def f(nums):\n    total = 0\n    for x in nums:\n        if x > 3:\n            total += x * 2\n    return total\n"
    for _ in range(20):
        other = wrong_program(program, rng, others=["def f(a):\n    return a\n"])
        assert other != program
        assert any(isinstance(n, ast.FunctionDef) and n.name == "f" for n in ast.parse(other).body)


def test_value_type_names():
    assert value_type("3") == "an int"
    assert value_type("['a']") == "a list of strings"
    assert value_type("[1, 2]") == "a list of ints"
    assert value_type("{'a': 1}") == "a dict"
    assert value_type("not a literal(") == "a value"


def test_bad_mix_is_a_clear_error():
    with pytest.raises(ValueError, match="p_correct"):
        ExampleMix(p_correct=1.5)
    with pytest.raises(ValueError, match="non-empty corpus"):
        ExampleWriter([], ExampleMix(), random.Random(0))
