"""A command's model-directory option, checked before anything loads (no pydantic: the verifier's
command line uses it too)."""

from __future__ import annotations

import argparse
from pathlib import Path


def model_dir_argument(text: str) -> Path:
    """``type=`` of a command's model-directory option: the directory, or, where it holds no ``config.json`` (a path
    that does not exist, a typo, a file), argparse's one-line error naming it before anything loads."""
    path = Path(text).expanduser()
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a model directory (no config.json there)")
    return path
