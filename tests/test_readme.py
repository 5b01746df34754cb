"""README.md matches the code: every command of its bash blocks parses with the argument parser of the program it
runs (``launch.py``'s, each module's own), every configuration the ``launch.py`` commands name loads with their
overrides, the dry runs it shows plan, and the numbers it quotes from the 7B dry runs are the ones they print.
Nothing is run: the module commands stop right after their parser accepted the arguments."""

from __future__ import annotations

import argparse
import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

import launch

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PROSE = " ".join(README.split())  # line breaks as spaces, for phrases
MAX_LINES = 250


def bash_commands(text: str) -> list[list[str]]:
    """The ``python`` command lines of the bash blocks (continuations joined, comments and environment
    assignments dropped, ``ray job submit ... --`` stripped): each as the argument list after ``python``."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "&&" in words:  # `bash install.sh && python launch.py`: the command after the set-up
                words = words[len(words) - words[::-1].index("&&") :]
            if "--" in words:
                words = words[words.index("--") + 1 :]
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words = words[1:]
            if words and words[0] == "python" and not any(w.startswith("[") for w in words):  # not the usage line
                out.append(words[1:])
    return out


COMMANDS = bash_commands(README)


class Parsed(BaseException):
    """Raised in place of running a module once its parser accepted the arguments."""


def parse_module(module: str, argv: list[str], monkeypatch) -> argparse.Namespace:
    """Run ``python -m module argv`` only as far as its argument parser: the real parser, stopped right after it
    accepted ``argv`` (a rejection is the parser's own ``SystemExit(2)``)."""
    real = argparse.ArgumentParser.parse_args
    seen: list[argparse.Namespace] = []

    def parse_then_stop(self, args=None, namespace=None):
        seen.append(real(self, args, namespace))
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(Parsed):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return seen[-1]


def test_the_readme_is_short_and_its_commands_were_found():
    assert len(README.splitlines()) <= MAX_LINES
    assert len(COMMANDS) >= 15, COMMANDS
    assert ["launch.py"] in COMMANDS and any(c[:2] == ["-m", "evaluation.export"] for c in COMMANDS)


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "-m" and c[1] != "pytest"], ids=lambda c: " ".join(c)[:60])
def test_every_module_command_parses_with_its_modules_parser(argv, monkeypatch):
    parse_module(argv[1], argv[2:], monkeypatch)


def test_the_test_command_is_the_one_ci_runs():
    (command,) = [c for c in COMMANDS if c[:2] == ["-m", "pytest"]]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python " + " ".join(command) in ci


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "launch.py"], ids=lambda c: " ".join(c)[:60])
def test_every_launch_command_parses_and_its_config_loads(argv, monkeypatch):
    monkeypatch.chdir(ROOT)  # as a user runs them: from the checkout (nothing is created)
    monkeypatch.setenv("POPULORA_MODEL", "/models/Qwen2.5-7B")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    args = launch.parse_args(argv[1:])
    if args.resume is not None:
        return  # continues a run directory of its own (its saved config): the parser is what can be checked here
    config = launch.resolve_config(args)
    assert config.run.run_dir


def test_the_usage_line_names_launchs_options():
    usage = next(line for line in README.splitlines() if line.startswith("python launch.py [--config"))
    named = set(re.findall(r"(--[a-z][a-z-]*)", usage))
    known = {option for action in launch_parser()._actions for option in action.option_strings}
    assert named and named <= known, named - known
    assert {o for o in known if o.startswith("--") and o != "--help"} <= named, "an option the usage line leaves out"


def launch_parser() -> argparse.ArgumentParser:
    """launch.py's parser, caught as it parses."""
    parsers: list[argparse.ArgumentParser] = []
    real = argparse.ArgumentParser.parse_args

    def catch(self, args=None, namespace=None):
        parsers.append(self)
        return real(self, args, namespace)

    argparse.ArgumentParser.parse_args = catch
    try:
        launch.parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = real
    return parsers[-1]


@pytest.fixture(scope="module")
def model_7b(tmp_path_factory) -> Path:
    """A directory with Qwen2.5-7B's config.json: what the dry run reads to plan the 7B presets."""
    from bench import qwen25_7b

    path = tmp_path_factory.mktemp("qwen7b")
    (path / "config.json").write_text(json.dumps(qwen25_7b.CONFIG))
    return path


def dry_run(config: str, model: Path, capsys) -> str:
    assert launch.main(["--dry-run", "--config", config, f"model.path={model}"]) == 0
    return capsys.readouterr().out


def test_the_7b_numbers_it_quotes_are_the_dry_runs(model_7b, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    quoted = dict((preset, int(n)) for n, preset in re.findall(r"(\d+) for\s+`(qwen[\w.-]+\.yaml)`", README))
    assert set(quoted) == {"qwen2.5-7b-4t4s.yaml", "qwen2.5-7b-single.yaml"}
    for preset, value in quoted.items():
        out = dry_run(f"configs/{preset}", model_7b, capsys)
        assert f"inference.vllm_engine_args.max_num_seqs={value};" in out, preset
        if preset == "qwen2.5-7b-4t4s.yaml":
            time_line = out.strip().splitlines()[-1]
            assert f"`{time_line}`" in README, time_line
            engines = re.findall(r"^inference-\d+\s+\d+\s+1\s+GPU (\d+)", out, re.M)
            learners = sorted(set(re.findall(r"^learner-\w+-\d+\s+\d+\s+0\.5\s+GPU (\d+)", out, re.M)))
            words = {5: "five", 3: "three", 4: "four"}
            assert f"{words[len(engines)]} vLLM inference replicas on GPUs {engines[0]}-{engines[-1]}" in PROSE
            assert f"the learners on GPUs {learners[0]}-{learners[-1]}" in PROSE


def test_the_resume_example_matches_the_default_checkpoint_interval():
    from configs import load_config

    every = load_config(None).run.checkpoint_every
    assert f"tiny.yaml checkpoints every {every} steps" in PROSE


def test_every_page_it_links_exists():
    for target in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", README):
        assert (ROOT / target).is_file(), target
    for page in (ROOT / "docs").glob("*.md"):
        for target in re.findall(r"\]\(([\w./-]+\.md)\)", page.read_text()):
            assert (page.parent / target).is_file(), f"{page.name} links {target}"
