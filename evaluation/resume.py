"""Finished benchmarks saved as they finish, so an interrupted evaluation resumes without generating
or judging them again.

Each finished benchmark goes to ``OUT_DIR/finished/<benchmark>.json`` (written to a temporary file,
then renamed: a file that exists is whole) with a *fingerprint* of everything its numbers depend on:
the benchmark files' sha256, the models (labels and adapter directories' checkpoint), the decoding,
the prompt style, the limits and ``--limit``. A later run with the same fingerprint takes the saved
scores; any difference (an edited file, another checkpoint, other samples) evaluates it again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from evaluation.references import file_digest


def fingerprint(benchmark: str, paths: list[Path], settings: dict[str, Any]) -> str:
    """sha256 over the benchmark's name, its files' contents and the evaluation settings (JSON)."""
    h = hashlib.sha256()
    h.update(json.dumps({"benchmark": benchmark, "files": [file_digest(p) for p in paths], "settings": settings},
                        sort_keys=True, default=str).encode())
    return h.hexdigest()


class FinishedBenchmarks:
    """The finished benchmarks of one output directory."""

    def __init__(self, out_dir: Path):
        self.root = out_dir / "finished"

    def load(self, benchmark: str, print_: str) -> dict[str, Any] | None:
        """The saved record of ``benchmark`` when its fingerprint is ``print_``, else None."""
        try:
            record = json.loads((self.root / f"{benchmark}.json").read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("fingerprint") == print_ else None

    def save(self, benchmark: str, print_: str, record: dict[str, Any]) -> Path:
        """Save ``record`` (scores per model, timing, problem count) under its fingerprint."""
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.root / f"{benchmark}.json"
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**record, "fingerprint": print_}))
        os.replace(tmp, target)
        return target
