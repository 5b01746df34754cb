"""No file of the project names an issue by its number (the word, any case, then the number, with a space, a dash or
an underscore between): code, configs, tests and docs say what a thing is (the regime gate, the saved progress of a
build), not which issue made it. Every file git tracks is read, this one too; only files with NUL bytes are not text,
and those must be model weights."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE_NUMBER = re.compile(r"\bissues?[\s_-]*(?:no\.?\s*)?#?\d+", re.I)
"""An issue of this project named by its number (a third-party one is named by its repository: owner/repo#N)."""
BINARY_SUFFIXES = {".safetensors"}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_the_pattern_finds_the_ways_an_issue_is_named():
    word = "issue"  # the examples are built, so that this file holds none of them
    for text in (f"{word} 64", f"{word.title()} 64's gate", f"{word}-64", f"{word}s 24 and 40", f"({word} #21)",
                 f"{word.upper()}_51"):
        assert ISSUE_NUMBER.search(text), text
    for text in ("wandb/wandb#9646", "the issues it raises", "an issue: 3 of them"):
        assert not ISSUE_NUMBER.search(text), text


def test_no_tracked_file_names_an_issue_number():
    files = tracked_files()
    assert len(files) > 100  # the checkout's files, not an empty listing
    found, binary = [], []
    for path in files:
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data:
            binary.append(path)
            continue
        for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if ISSUE_NUMBER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert all(p.suffix in BINARY_SUFFIXES for p in binary), [str(p) for p in binary if p.suffix not in BINARY_SUFFIXES]
    assert not found, "\n".join(found)
