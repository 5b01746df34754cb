"""Grading math answers: Math-Verify in a worker process with a timeout, or a fallback normaliser.

The answer of a response is the text inside its last ``<answer>...</answer>``, then that text's last
``\\boxed{}``; else the last ``\\boxed{}`` of the whole response (``extract_answer``).

With the ``math-verify`` package (a dependency of this project) the grade is
``verify(parse(gold), parse(prediction))``, gold first (Math-Verify is not symmetric). Its parse and
verify time themselves out with ``signal.alarm``, which only works in a main thread, so they run
in the main thread of one worker process; a worker that does not answer within ``timeout_s`` is
killed and restarted and that answer is graded wrong ("grading timed out").

Where ``math-verify`` cannot be imported the fallback (``normalised_equal``) is used and every
verdict says so (``grader`` in results.json is ``fallback``): LaTeX spacing and wrappers removed,
``\\dfrac``/``\\tfrac`` as ``\\frac``, then numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``)
compared with relative tolerance 1e-4 (Qwen2.5-Math's numeric rule), else the strings.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import re
from fractions import Fraction
from typing import Any, Sequence

from evaluation.datasets import last_boxed

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(response: str) -> str | None:
    """The model's final answer: last ``<answer>`` block (its last ``\\boxed{}`` if any), else the
    last ``\\boxed{}`` anywhere; None when there is neither."""
    tags = ANSWER_TAG.findall(response)
    if tags:
        inner = tags[-1]
        boxed = last_boxed(inner)
        return (boxed if boxed is not None else inner).strip()
    boxed = last_boxed(response)
    return boxed.strip() if boxed is not None else None


def _strip_latex(text: str) -> str:
    s = text.strip().strip("$").strip()
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""), ("\\!", ""),
                     ("\\,", ""), ("\\;", ""), ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", ""), ("%", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    return s


def _number(text: str) -> Fraction | float | None:
    s = text.replace(",", "")
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s) or re.fullmatch(r"(-?)\\frac(\d)(\d)", s)
    if m:
        value = Fraction(int(m.group(2)), int(m.group(3))) if int(m.group(3)) else None
        return -value if value is not None and m.group(1) else value
    m = re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2))) if int(m.group(2)) else None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def normalised_equal(gold: str, prediction: str) -> bool:
    """The fallback grade: equal numbers (relative tolerance 1e-4) or equal normalised strings."""
    g, p = _strip_latex(gold), _strip_latex(prediction)
    if g == p:
        return True
    a, b = _number(g), _number(p)
    if a is not None and b is not None:
        return abs(float(a) - float(b)) <= 1e-4 * max(1.0, abs(float(a)))
    return False


def math_verify_available() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _as_latex(text: str) -> str:
    """Text Math-Verify's LaTeX extractor reads: a boxed expression (plain numbers parse as well)."""
    return text if "\\boxed" in text or text.startswith("$") else f"\\boxed{{{text}}}"


def _worker(conn: Any) -> None:
    from math_verify import parse, verify

    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            return
        gold, prediction = item
        try:
            ok = bool(verify(parse(_as_latex(gold)), parse(_as_latex(prediction))))
            conn.send((ok, ""))
        except Exception as exc:  # a parse failure is a wrong answer, with the reason
            conn.send((False, f"math-verify error: {type(exc).__name__}: {str(exc)[:100]}"))


class MathGrader:
    """Grades (gold, prediction) pairs; ``grader`` is ``math-verify`` or ``fallback``."""

    def __init__(self, timeout_s: float = 10.0, use_math_verify: bool | None = None):
        self.timeout_s = float(timeout_s)
        self.grader = "math-verify" if (math_verify_available() if use_math_verify is None else use_math_verify) else "fallback"
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child,), daemon=True, name="math-verify-worker")
        self._proc.start()
        child.close()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(timeout=5)
            self._conn.close()
            self._proc = self._conn = None

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(None)
                self._proc.join(timeout=2)
            except OSError:
                pass
        self._stop()

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def grade(self, gold: str, prediction: str | None) -> tuple[bool, str]:
        """(correct, reason); reason is empty for a right answer."""
        if prediction is None or not prediction.strip():
            return False, "no answer found (no <answer> and no \\boxed{})"
        if self.grader == "fallback":
            ok = normalised_equal(gold, prediction)
            return ok, "" if ok else f"wrong answer {prediction[:80]!r} (fallback grader: math-verify not installed)"
        if self._proc is None:
            self._start()
        self._conn.send((gold, prediction))
        # the first answer also waits for the worker's import of math_verify
        if not self._conn.poll(self.timeout_s + 30.0 * (not getattr(self, "_warm", False))):
            self._stop()
            return False, f"grading timed out after {self.timeout_s:g} s"
        self._warm = True
        try:
            ok, error = self._conn.recv()
        except (EOFError, OSError):
            self._stop()
            return False, "the math-verify worker died while grading this answer"

        return ok, "" if ok else (error or f"wrong answer {prediction[:80]!r}")

    def grade_many(self, pairs: Sequence[tuple[str, str | None]]) -> list[tuple[bool, str]]:
        return [self.grade(gold, prediction) for gold, prediction in pairs]
