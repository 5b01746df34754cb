"""The program generator: valid, deterministic, size-controlled programs that the real sandbox runs."""

from __future__ import annotations

import ast
import random
import statistics

import pytest

from tinycoder.corpus import CorpusSettings, build_corpus, draw_programs
from tinycoder.programs import ARG_TYPES, ProgramShape, ShapeRange, generate_program, random_args, random_value
from verifier.prompts import parse_arguments
from verifier.sandbox import Status, Verifier


def _programs(seed: int, count: int, shapes: ShapeRange = ShapeRange()):
    rng = random.Random(seed)
    return [generate_program(rng, shapes.draw(rng)) for _ in range(count)]


def test_programs_parse_and_define_f_with_one_parameter_per_argument_type():
    for program in _programs(0, 400):
        tree = ast.parse(program.source)
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef), program.source
        f = tree.body[0]
        assert f.name == "f"
        assert len(f.args.args) == len(program.arg_types) >= 1
        assert isinstance(f.body[-1], ast.Return), program.source
        assert program.message.startswith("Given ")


def test_same_seed_same_programs_other_seed_other_programs():
    first = [p.source for p in _programs(7, 50)]
    assert first == [p.source for p in _programs(7, 50)]
    assert first != [p.source for p in _programs(8, 50)]


def test_shape_knobs_control_size():
    rng = random.Random(1)

    def mean_lines(shape: ProgramShape) -> float:
        return statistics.mean(generate_program(rng, shape).source.count("\n") for _ in range(150))

    one_liner = mean_lines(ProgramShape(phases=0, depth=1, expr_depth=1))
    small = mean_lines(ProgramShape(phases=1, depth=2, expr_depth=2))
    large = mean_lines(ProgramShape(phases=4, depth=3, expr_depth=3))
    assert one_liner == 2.0  # "def f(...):" and "return ..."
    assert one_liner < small < large


def test_variety_of_idioms():
    phases = {name for p in _programs(2, 300) for name in p.phases}
    assert {"map", "filter", "sum", "count", "tally", "nested", "search", "reduce"} <= phases


@pytest.mark.parametrize("bad", [dict(phases=-1), dict(phases=9), dict(depth=0), dict(expr_depth=5)])
def test_bad_shape_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="ProgramShape"):
        ProgramShape(**bad)


def test_random_args_are_literal_argument_lists_of_the_right_types():
    rng = random.Random(3)
    expected = {"int": int, "str": str, "list[int]": list, "list[str]": list, "dict[str, int]": dict}
    for _ in range(200):
        types = tuple(rng.choice(ARG_TYPES) for _ in range(rng.randint(1, 3)))
        args, kwargs = parse_arguments(random_args(rng, types))
        assert not kwargs and len(args) == len(types)
        assert all(isinstance(a, expected[t]) for a, t in zip(args, types))
    with pytest.raises(ValueError, match="unknown value type"):
        random_value(rng, "complex")


def test_generated_programs_run_in_the_sandbox():
    """Nearly every generated (program, input) pair runs: the grammar is type-directed."""
    settings = CorpusSettings(programs=60, inputs_per_program=2, min_inputs=1)
    drafts = draw_programs(settings, random.Random(5))
    pairs = [(p.source, args) for p, inputs in drafts for args in inputs]
    with Verifier(timeout_s=2.0) as verifier:
        results = verifier.execute_many(pairs)
    ok = sum(r.status is Status.OK for r in results)
    assert ok >= 0.9 * len(pairs), [(r.status, r.error) for r in results if r.status is not Status.OK][:5]


def test_corpus_keeps_only_pairs_the_sandbox_accepts_with_their_outputs():
    settings = CorpusSettings(programs=40, inputs_per_program=3, min_inputs=2, max_output_chars=30)
    with Verifier(timeout_s=2.0) as verifier:
        corpus = build_corpus(verifier, settings, seed=11)
        assert corpus and len(corpus) <= 40
        for item in corpus[:10]:
            assert len(item.inputs) == len(item.outputs) >= 2
            for args, output in zip(item.inputs, item.outputs):
                again = verifier.execute(item.program.source, args)
                assert again.status is Status.OK and again.output == output
                assert len(output) <= 30
    # Constant programs (one output for every input) are mostly dropped.
    constant = sum(len(set(item.outputs)) == 1 for item in corpus)
    assert constant <= 0.25 * len(corpus)
