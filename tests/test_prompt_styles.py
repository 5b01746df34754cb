"""The prompt styles (compact, r1, chat) end to end: each family's prompts in each style, a well-formed
response in the layout the prompt states, the parser and the real verifier reading back the same task
or answer; every rule the verifier enforces stated in the prompt, from the guard's own lists and the
configured limits; the chat template of a tiny local tokenizer, and a clear error for a model without one.
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.conftest import build_tokenizer
from verifier.families import judge_answers, validate_proposals
from verifier.guard import ALLOWED_MODULES, FORBIDDEN_NAMES, REMOVED_BUILTINS, SAFE_DUNDERS
from verifier.prompt_styles import FRAMING, Prompter, PromptStyleError, TaskRules
from verifier.prompts import parse_answer, parse_proposal, student_prompt, student_response, teacher_prompt, teacher_response
from verifier.sandbox import Status, Verifier
from verifier.task_limits import TaskLimits
from verifier.tasks import FAMILIES, Task, identity_task

PROGRAM = "def f(xs, k):\n    return sorted(xs)[:k]"
REFS = [identity_task("code_o"), Task("code_o", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"])]
N_INPUTS = 4
# A ChatML layout written for these tests (Qwen-like: a default system turn when none is given).
CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# What a teacher proposes and a student answers, per family (code_f: inputs and message for PROGRAM).
PROPOSALS = {
    "code_o": dict(program="def f(s):\n    out = []\n    for c in s:\n        out.insert(0, c.upper())\n    return ''.join(out)",
                   inputs=["'abc'"]),
    "code_i": dict(program="import math\n\ndef f(n, m=2):\n    return math.gcd(n, m) * n", inputs=["12, m=8"]),
    "code_f": dict(inputs=["[5, 4], 1", "[9], 1", "[2, 8], 2", "[7, 6, 5], 1"], message="the k smallest items, in order"),
}
TASKS = {
    "code_o": Task("code_o", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"]),
    "code_i": Task("code_i", PROGRAM, ["[3, 1, 2], 2"], ["[1, 2]"]),
    "code_f": Task("code_f", PROGRAM, PROPOSALS["code_f"]["inputs"], ["[4]", "[9]", "[2, 8]", "[5]"], "sorts"),
}
ANSWERS = {"code_o": "[1, 2]", "code_i": "[2, 1, 3], 2", "code_f": "def f(xs, k):\n    return sorted(xs)[:k]"}


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    tok = build_tokenizer(tmp_path_factory.mktemp("chat_tok"))
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def verifier():
    with Verifier() as v:
        yield v


def prompter(style: str, tokenizer=None, rules: TaskRules | None = None) -> Prompter:
    return Prompter(style, rules or TaskRules(n_inputs=N_INPUTS), tokenizer if style == "chat" else None)


def continuation(response: str) -> str:
    """A model's text after an r1/chat prompt, which already ends with <think>."""
    assert response.startswith("<think>")
    return response[len("<think>"):]


def test_compact_prompts_are_pinned_byte_for_byte():
    """The tiny model is trained on these exact strings: any change must be deliberate."""
    assert teacher_prompt("code_o", REFS, n_inputs=4) == (
        "User: Write a new function f and one input for it, so that the output is hard to deduce. Think in "
        "<think></think>, then answer in <answer></answer> with a ```python block and an ```input block.\n<ref>\n"
        "```python\ndef f(a):\n    return a\n```\n```input\n'Hello world'\n```\n```output\n'Hello world'\n```\n</ref>\n"
        "<ref>\n```python\ndef f(xs, k):\n    return sorted(xs)[:k]\n```\n```input\n[3, 1, 2], 2\n```\n```output\n"
        "[1, 2]\n```\n</ref>\nAssistant: "
    )
    assert teacher_prompt("code_i", REFS[:1], n_inputs=4) == (
        "User: Write a new function f and one input for it, so that the input is hard to infer from the output. "
        "Think in <think></think>, then answer in <answer></answer> with a ```python block and an ```input block.\n"
        "<ref>\n```python\ndef f(a):\n    return a\n```\n```input\n'Hello world'\n```\n```output\n'Hello world'\n```\n"
        "</ref>\nAssistant: "
    )
    assert teacher_prompt("code_f", REFS, n_inputs=4) == (
        "User: Give 4 different inputs for f and a message that hints at what f does without showing code. Think in "
        "<think></think>, then answer in <answer></answer> with 4 ```input blocks and a ```message block.\n```python\n"
        "def f(a):\n    return a\n```\nAssistant: "
    )
    assert student_prompt(TASKS["code_o"]) == (
        "User: Deduce the output of f for the input. Think in <think></think>, then answer in <answer></answer> with "
        "an ```output block.\n```python\ndef f(xs, k):\n    return sorted(xs)[:k]\n```\n```input\n[3, 1, 2], 2\n```\n"
        "Assistant: "
    )
    assert student_prompt(TASKS["code_i"]) == (
        "User: Find an input for which f returns the output. Think in <think></think>, then answer in "
        "<answer></answer> with an ```input block.\n```python\ndef f(xs, k):\n    return sorted(xs)[:k]\n```\n"
        "```output\n[1, 2]\n```\nAssistant: "
    )
    assert student_prompt(TASKS["code_f"]) == (
        "User: Write a function f that maps each input to its output. Think in <think></think>, then answer in "
        "<answer></answer> with a ```python block.\n```message\nsorts\n```\n```input\n[5, 4], 1\n```\n```output\n"
        "[4]\n```\n```input\n[9], 1\n```\n```output\n[9]\n```\nAssistant: "
    )
    compact = prompter("compact")
    for family in FAMILIES:
        assert compact.teacher(family, REFS) == teacher_prompt(family, REFS, n_inputs=N_INPUTS)
        assert compact.student(TASKS[family]) == student_prompt(TASKS[family])


@pytest.mark.parametrize("style", ["r1", "chat"])
@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_prompt_response_parse_validate_round_trip(style, family, chat_tokenizer, verifier):
    p = prompter(style, chat_tokenizer)
    refs = REFS[::-1] if family == "code_f" else REFS  # code_f probes the first reference's program
    prompt = p.teacher(family, refs)
    assert prompt.endswith("<think>")
    if style == "r1":
        assert prompt.startswith(FRAMING + "\n\nUser: Task: ") and prompt.endswith("\nAssistant: <think>")
    else:
        assert prompt.startswith(f"<|im_start|>system\n{FRAMING}<|im_end|>\n<|im_start|>user\nTask: ")
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n<think>")
    if family == "code_f":
        assert refs[0].program in prompt and refs[1].program not in prompt and f"write {N_INPUTS} different inputs" in prompt
    else:
        assert all(t.program in prompt and t.input in prompt and t.output in prompt for t in REFS)
    given = PROPOSALS[family]
    text = continuation(teacher_response(family, think="I plan a loop and a slice.", **given))
    program = refs[0].program if family == "code_f" else None
    proposal = parse_proposal(family, text, program=program, n_inputs=N_INPUTS)
    assert proposal.error is None and proposal.inputs == given["inputs"]
    assert proposal.program == (program or given["program"]) and proposal.message == given.get("message", "")
    (checked,) = validate_proposals(verifier, family, [proposal], n_inputs=N_INPUTS if family == "code_f" else None)
    assert checked.valid, checked.reason
    assert checked.task.program == proposal.program and checked.task.inputs == given["inputs"]


@pytest.mark.parametrize("style", ["r1", "chat"])
@pytest.mark.parametrize("family", FAMILIES)
def test_student_prompt_response_parse_judge_round_trip(style, family, chat_tokenizer, verifier):
    task = TASKS[family]
    prompt = prompter(style, chat_tokenizer).student(task)
    assert prompt.endswith("<think>") and task.message in prompt
    shown = {"code_o": [task.program, task.input], "code_i": [task.program, task.output],
             "code_f": [x for pair in task.shown_pairs() for x in pair]}[family]
    hidden = {"code_o": [f"```output\n{task.output}"], "code_i": [f"```input\n{task.input}"],
              "code_f": [task.program] + [i for i, _ in task.hidden_pairs()]}[family]
    assert all(s in prompt for s in shown) and not any(h in prompt for h in hidden)
    text = continuation(student_response(family, ANSWERS[family], think="Step by step."))
    answer = parse_answer(family, text)
    assert answer.well_formed and answer.value == ANSWERS[family]
    (judgement,) = judge_answers(verifier, [(task, text)])
    assert judgement.well_formed and judgement.correct, judgement.reason


@pytest.mark.parametrize("style", ["r1", "chat"])
@pytest.mark.parametrize("role", ["teacher", "student"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_layout_the_prompt_states_is_the_layout_the_parser_reads(style, role, family, chat_tokenizer):
    """The example answer inside the prompt, placeholders and all, parses into its placeholders."""
    p = prompter(style, chat_tokenizer)
    prompt = p.teacher(family, REFS) if role == "teacher" else p.student(TASKS[family])
    stated = re.findall(r"write exactly:\n(<answer>\n.*?\n</answer>)\n", prompt, re.DOTALL)
    assert len(stated) == 1
    response = "my reasoning</think>\n" + stated[0]
    if role == "teacher":
        proposal = parse_proposal(family, response, program="x", n_inputs=N_INPUTS)
        assert proposal.error is None
        if family == "code_f":
            assert proposal.inputs == [f"<input {i}>" for i in range(1, N_INPUTS + 1)] and proposal.message == "<message>"
        else:
            assert proposal.program == "<your program, defining f>" and proposal.inputs == ["<one input: the arguments of f>"]
    else:
        answer = parse_answer(family, response)
        assert answer.layout_ok and answer.value is not None and answer.value.startswith("<")


# Every verdict the sandbox gives a task, and the words of the rule that prevents it.
RULE_OF_STATUS = {
    Status.SYNTAX_ERROR: "It is Python 3",
    Status.NO_ENTRY_FUNCTION: "defines a function named `f` at the top level",
    Status.FORBIDDEN: "Imports: only these standard-library modules",
    Status.BAD_INPUT: "Only literals",
    Status.RUNTIME_ERROR: "an uncaught exception makes the task invalid",
    Status.TIMEOUT: "It finishes within 5 seconds",
    Status.MEMORY_LIMIT: "512 MB of memory",
    Status.NONDETERMINISTIC: "Deterministic: called twice on the same input",
    Status.OUTPUT_TOO_LARGE: "The output is at most 1000 characters",
    Status.BAD_OUTPUT: "it must be a Python literal",
}


def test_every_verdict_of_the_sandbox_has_a_stated_rule():
    assert set(RULE_OF_STATUS) == set(Status) - {Status.OK, Status.CRASHED}, "a new verdict needs a rule in the prompt"


@pytest.mark.parametrize("family", ["code_o", "code_i"])
def test_teacher_prompts_state_every_rule_the_verifier_enforces(family):
    prompt = prompter("r1").teacher(family, REFS)
    for words in RULE_OF_STATUS.values():
        assert words in prompt, words
    for module in ALLOWED_MODULES - {"__future__"}:
        assert re.search(rf"[ :]{re.escape(module)}[,( ]", prompt), module
    assert "from __future__ import" in prompt
    for name in (FORBIDDEN_NAMES | REMOVED_BUILTINS):
        if not name.startswith("__"):
            assert re.search(rf"\b{name}\b", prompt), name
    for name in SAFE_DUNDERS:
        assert name in prompt, name
    for bad in ("os", "sys", "random", "time", "subprocess", "datetime"):
        assert not re.search(rf"modules: [^\n]*\b{bad}\b,", prompt), f"{bad} is not allowed but listed"
    limits = TaskLimits()
    for words in (f"{limits.program_chars} characters and {limits.program_tokens} tokens",
                  f"{limits.input_chars} characters and {limits.input_tokens} tokens",
                  f"{limits.output_chars} characters and {limits.output_tokens} tokens"):
        assert words in prompt


def test_code_f_prompts_state_the_input_output_and_message_rules():
    teacher = prompter("r1").teacher("code_f", REFS)
    for status in (Status.BAD_INPUT, Status.OUTPUT_TOO_LARGE, Status.BAD_OUTPUT):
        assert RULE_OF_STATUS[status] in teacher
    assert "finish without an error" in teacher and "5 seconds, 512 MB" in teacher
    assert f"Exactly {N_INPUTS} inputs" in teacher and "must not contain the code" in teacher
    student = prompter("r1").student(TASKS["code_f"])
    for status in (Status.SYNTAX_ERROR, Status.NO_ENTRY_FUNCTION, Status.FORBIDDEN, Status.NONDETERMINISTIC):
        assert RULE_OF_STATUS[status] in student


def test_rules_follow_the_configured_limits():
    rules = TaskRules(TaskLimits(program_chars=1234, program_tokens=321, input_chars=77, output_chars=55),
                      timeout_s=2.5, memory_mb=300, n_inputs=6)
    prompt = prompter("r1", rules=rules).teacher("code_o", REFS)
    assert "At most 1234 characters and 321 tokens" in prompt and "at most 77 characters" in prompt
    assert "at most 55 characters" in prompt and "2.5 seconds and 300 MB" in prompt
    assert "write 6 different inputs" in prompter("r1", rules=rules).teacher("code_f", REFS)


def test_chat_needs_a_chat_template(tmp_path, chat_tokenizer):
    plain = build_tokenizer(tmp_path / "plain")
    plain.chat_template = None
    with pytest.raises(PromptStyleError, match="has none .*Use tasks.prompt_style=r1"):
        Prompter("chat", TaskRules(), plain, source="/models/base")
    with pytest.raises(PromptStyleError, match="needs the model's tokenizer"):
        Prompter("chat", TaskRules(), None)
    with pytest.raises(PromptStyleError, match="unknown prompt style 'fancy'"):
        Prompter("fancy", TaskRules())
    # the engine counts the rendered text the same way: special tokens of the template are single tokens
    prompt = Prompter("chat", TaskRules(), chat_tokenizer).student(TASKS["code_o"])
    ids = chat_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(chat_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_start_up_refuses_chat_on_a_model_without_a_template_before_any_actor(tiny_qwen2, tmp_path, capsys):
    import shutil

    from actors.driver import train
    from configs import load_config

    model = tmp_path / "base"
    shutil.copytree(tiny_qwen2, model)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config_file = model / "tokenizer_config.json"
    config_file.write_text(re.sub(r',\s*"chat_template":\s*"(?:[^"\\]|\\.)*"', "", config_file.read_text()))
    config = load_config(None, [f"model.path={model}", "tasks.prompt_style=chat", f"run.run_dir={tmp_path / 'run'}"])
    assert train(config) == 2
    err = capsys.readouterr().err
    assert "tasks.prompt_style=chat" in err and "has none" in err
    import ray

    assert not ray.is_initialized(), "the check runs before the cluster and the actors start"


def test_r1_and_chat_outputs_parse_despite_stray_text():
    cases = [
        "Let me use <answer> tags at the end.</think>\n<answer>\n```output\n5\n```\n</answer>\nThat is my answer.",
        "<think>\nrepeat of the opening tag</think><answer>```output\n5\n```</answer>",
        "x</think>\n<answer>\n```output\n5\n```\n</answer>\nOops, <answer> again",
        "x</think>\r\n<answer>\r\n```output\r\n5\r\n```\r\n</answer>",
    ]
    for text in cases:
        answer = parse_answer("code_o", text)
        assert answer.well_formed and answer.value == "5", text
    bad = parse_answer("code_o", "I think the answer is 5.")
    assert not bad.well_formed and bad.error == "no <answer> in the response"


def test_a_response_cut_at_max_tokens_says_truncated(verifier):
    cut = "I start tracing the loop: i = 0, total = 0, then i = 1"
    answer = parse_answer("code_o", cut, truncated_at_limit=True)
    assert not answer.well_formed and answer.error.startswith("truncated: ") and "no <answer>" in answer.error
    assert parse_answer("code_o", cut).error == "no <answer> in the response"
    proposal = parse_proposal("code_o", "plan</think>\n<answer>\n```python\ndef f(a):\n    return a\n```\n```inp",
                              truncated_at_limit=True)
    assert proposal.error.startswith("truncated: ") and "no ```input block" in proposal.error
    # an answer that was complete before the cut is still well formed
    done = continuation(student_response("code_o", "[1, 2]")) + "\nand more text that was cut"
    assert parse_answer("code_o", done, truncated_at_limit=True).well_formed
    judged = judge_answers(verifier, [(TASKS["code_o"], cut, True), (TASKS["code_o"], done, True), (TASKS["code_o"], cut)])
    assert judged[0].reason.startswith("truncated: ") and judged[1].correct
    assert not judged[2].reason.startswith("truncated")


def test_prompts_command_prints_every_family_with_token_counts(tiny_qwen2, capsys):
    from verifier.__main__ import main

    assert main(["prompts", "--style", "chat", "--model", str(tiny_qwen2), "--config", "configs/qwen2.5-7b-4t4s.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.count("===== chat teacher prompt") == 3 and out.count("===== chat student prompt") == 3
    assert out.count("<|im_start|>system\n" + FRAMING) == 6
    counts = [int(n) for n in re.findall(r"^----- (\d+) tokens; budget 4096 ", out, re.MULTILINE)]
    assert len(counts) == 6 and all(n > 100 for n in counts)
    assert "write 10 different inputs" in out  # the preset's code_f_inputs
    assert main(["prompts", "--style", "r1", "--family", "code_i", "--role", "student"]) == 0
    out = capsys.readouterr().out
    assert out.count("=====") == 2 and "characters (pass --model DIR for token counts)" in out
    assert main(["prompts", "--style", "chat"]) == 2 and "pass --model DIR" in capsys.readouterr().out
