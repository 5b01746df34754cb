"""The ``python ...`` commands README.md and docs/*.md show a user, and the key each is tested under.

A command is every ``python`` command line of a bash block (continuations joined, comments dropped) and every inline
code span of the prose that holds one (``python -m ...``, ``python -c ...``, ``python <file>.py ...``; text from
``python`` on, up to ``&&``, ``;``, a pipe, a comment or prose after ``...``; a ``...`` standing alone is a
placeholder and stays). Its key is the entry point (``launch.py``, the module, a
module's subcommand such as ``verifier run``) and its sorted options, values left out: ``python -m evaluation.export
--checkpoint --member --merge``. A synopsis (an option in ``[...]``) is keyed ``usage: ...``; ``-c`` code is part of
its key, as written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BASH_BLOCK = re.compile(r"```(?:bash|sh|console)\n(.*?)```", re.S)
ANY_BLOCK = re.compile(r"```.*?```", re.S)
INLINE = re.compile(r"`([^`\n]+)`")
START = re.compile(r"(?:^|(?<=[\s(:]))python\s+(?=(?:-[SsBuOEI]\s+)*(?:-[mc]\s+\S|[\w./-]+\.py\b))")
"""Where a command starts: ``python`` as a word (not ``python3``, ``--python``, ``python_guards``), then interpreter
options, and ``-m``/``-c`` with its argument or a script (a bare ``python -c`` names the idea, not a command)."""
END = re.compile(r"\s(?:&&|\|\|?|;)\s|\s#\s|\s\.\.\.(?!\s)")
INTERPRETER_OPTIONS = {"-S", "-s", "-B", "-u", "-O", "-E", "-I"}
SUBCOMMAND = re.compile(r"[a-z][a-z_]*")


@dataclass(frozen=True)
class DocCommand:
    """One command as a page shows it: where, its text from ``python`` on, and its key."""

    page: str
    text: str
    key: str
    words: tuple[str, ...]
    """The words after ``python`` (shell-split)."""


def command_texts(markdown: str) -> list[str]:
    """The command texts of one page, bash blocks first, then the inline spans of the prose."""
    lines = []
    for block in BASH_BLOCK.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(line.split(" #")[0] if " #" in line else line)
    lines += INLINE.findall(ANY_BLOCK.sub("", markdown))
    texts = []
    for line in lines:
        for start in START.finditer(line):
            text = line[start.start():]
            end = END.search(text)
            texts.append((text[:end.start()] if end else text).strip())
    return texts


def command_key(words: list[str]) -> str:
    """``python <entry> <sorted options>``, ``usage: `` in front of a synopsis."""
    words = list(words)
    while words and words[0] in INTERPRETER_OPTIONS:
        words = words[1:]
    if words[0] in ("-m", "-c"):
        entry, rest = f"{words[0]} {words[1]}", words[2:]
    else:
        entry, rest = words[0], words[1:]
    if rest and SUBCOMMAND.fullmatch(rest[0]):
        entry, rest = f"{entry} {rest[0]}", rest[1:]
    usage = any(w.startswith("[") for w in rest)
    options = sorted({w.lstrip("[").split("=")[0].rstrip("]") for w in rest if w.lstrip("[").startswith("-")})
    return ("usage: " if usage else "") + " ".join(["python", entry, *options])


def doc_commands(pages: list[Path] = PAGES) -> list[DocCommand]:
    """Every command of ``pages``, in page order."""
    out = []
    for page in pages:
        for text in command_texts(page.read_text()):
            words = shlex.split(text)[1:]
            out.append(DocCommand(str(page.relative_to(ROOT)), text, command_key(words), tuple(words)))
    return out


def options_of(key: str) -> list[str]:
    """The options of a key (``--checkpoint``, ``-n``)."""
    return [w for w in key.removeprefix("usage: ").split()[2:] if w.startswith("-")]
