"""Small benchmark files in every layout the evaluation reads, written by the tests themselves
(no third-party benchmark data in the repository). Each writer returns the file it wrote."""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import zlib
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list[dict[str, Any]], gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


HE_PROMPT = 'def add_halves(a: float, b: float) -> float:\n    """Half of a plus half of b."""\n'
HE_POLY = (
    "import math\n\ndef poly(xs, x):\n    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n"
    'def find_zero(xs):\n    """A zero of the polynomial with coefficients xs."""\n'
)
HE_ZERO = (
    "    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n        lo, hi = 2 * lo, 2 * hi\n"
    "    for _ in range(100):\n        mid = (lo + hi) / 2\n        if poly(xs, mid) * poly(xs, lo) > 0:\n            lo = mid\n"
    "        else:\n            hi = mid\n    return lo\n"
)


def humaneval_plus(path: Path) -> Path:
    """evalplus release layout, gzipped: a float task (1e-6 rule), find_zero (special oracle)."""
    rows = [
        {"task_id": "HumanEval/0", "prompt": HE_PROMPT, "entry_point": "add_halves", "canonical_solution": "    return a / 2 + b / 2\n",
         "base_input": [[1.0, 2.0], [0.1, 0.2]], "plus_input": [[1e9, 3.0]], "atol": 0, "contract": "", "test": ""},
        {"task_id": "HumanEval/32", "prompt": HE_POLY, "entry_point": "find_zero", "canonical_solution": HE_ZERO,
         "base_input": [[[1, 2]], [[-6, 11, -6, 1]]], "plus_input": [[[5, -1]]], "atol": 1e-6, "contract": "", "test": ""},
    ]
    return write_jsonl(path, rows, gz=path.name.endswith(".gz"))


def mbpp_plus(path: Path) -> Path:
    """evalplus release layout; Mbpp/2 takes tuples (the reference checks it)."""
    rows = [
        {"task_id": "Mbpp/2", "prompt": '"""\nWrite a function to find the shared elements of two tuples.\n'
         'assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))\n"""\n',
         "entry_point": "similar_elements",
         "canonical_solution": "def similar_elements(a, b):\n    assert isinstance(a, tuple) and isinstance(b, tuple)\n    return tuple(set(a) & set(b))\n",
         "base_input": [[[3, 4, 5, 6], [5, 7, 4, 10]]], "plus_input": [[[1, 2], [2, 3]], [[], [1]]], "atol": 0, "contract": ""},
        {"task_id": "Mbpp/3", "prompt": '"""\nWrite a python function to identify non-prime numbers.\nassert is_not_prime(2) == False\n"""\n',
         "entry_point": "is_not_prime",
         "canonical_solution": "import math\ndef is_not_prime(n):\n    if n < 2:\n        return True\n"
         "    return any(n % i == 0 for i in range(2, int(math.sqrt(n)) + 1))\n",
         "base_input": [[2], [10]], "plus_input": [[35], [37], [1]], "atol": 0, "contract": ""},
    ]
    return write_jsonl(path, rows)


def humaneval_check(path: Path) -> Path:
    """openai HumanEval layout: check(candidate) with the expected values written in."""
    rows = [{"task_id": "HumanEval/1", "prompt": 'def double(x):\n    """Twice x."""\n', "entry_point": "double",
             "canonical_solution": "    return 2 * x\n",
             "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2\n"}]
    return write_jsonl(path, rows, gz=path.name.endswith(".gz"))


def mbpp_asserts(path: Path) -> Path:
    rows = [{"task_id": 11, "prompt": "Write a function to remove the first and last occurrence of a character.",
             "code": "def remove_occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n    return s if i < 0 else s[:i] + s[i + 1:]\n",
             "test_imports": [], "test_list": ['assert remove_occ("hello","l") == "heo"', 'assert remove_occ("abcda","a") == "bcd"'],
             "test": ""}]
    return write_jsonl(path, rows)


def pickled_tests(tests: list[dict[str, str]]) -> str:
    """LiveCodeBench's private-test encoding: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode("ascii")


LCB_STDIN_SOLUTION = "import sys\nn = int(sys.stdin.readline())\nvals = list(map(int, input().split()))\nprint(sum(vals[:n]))\n"
LCB_FUNC_SOLUTION = "class Solution:\n    def maxPair(self, nums: List[int], k: int) -> List[int]:\n        return sorted(nums)[-k:]\n"


def livecodebench(path: Path) -> Path:
    """code_generation_lite rows: a stdin task (private tests pickled) and a functional task.
    ``reference_solution`` is this project's optional field for --oracle (the release has none)."""
    stdin_tests = [{"input": "2\n1 2 3\n", "output": "3\n", "testtype": "stdin"}]
    private = [{"input": "3\n4 5 6 7\n", "output": "15\n", "testtype": "stdin"}, {"input": "1\n-5\n", "output": "-5", "testtype": "stdin"}]
    func_tests = [{"input": "[3, 1, 2]\n2", "output": "[2, 3]", "testtype": "functional"}]
    rows = [
        {"question_title": "Prefix sum", "question_content": "Read n, then numbers; print the sum of the first n.",
         "platform": "atcoder", "question_id": "abc001_a", "contest_id": "abc001", "contest_date": "2024-01-01T00:00:00",
         "starter_code": "", "difficulty": "easy", "public_test_cases": json.dumps(stdin_tests),
         "private_test_cases": pickled_tests(private), "metadata": "{}", "reference_solution": LCB_STDIN_SOLUTION},
        {"question_title": "Largest k", "question_content": "Return the k largest numbers in ascending order.",
         "platform": "leetcode", "question_id": "9001", "contest_id": "weekly-1", "contest_date": "2024-02-01T00:00:00",
         "starter_code": "class Solution:\n    def maxPair(self, nums: List[int], k: int) -> List[int]:\n        ",
         "difficulty": "easy", "public_test_cases": json.dumps(func_tests),
         "private_test_cases": json.dumps([{"input": "[5]\n1", "output": "[5]", "testtype": "functional"}]),
         "metadata": json.dumps({"func_name": "maxPair"}), "reference_solution": LCB_FUNC_SOLUTION},
    ]
    return write_jsonl(path, rows)


MATH_ROWS: dict[str, list[dict[str, Any]]] = {
    "math500": [{"problem": "What is $1/2 + 1/4$?", "solution": "It is $\\boxed{\\frac{3}{4}}$.", "answer": "\\frac{3}{4}",
                 "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"}],
    "gsm8k": [{"question": "Tom has 1,200 apples and eats 2. How many are left?", "answer": "1200 - 2 = 1198\n#### 1,198"}],
    "aime24": [{"id": 60, "problem": "Find the remainder of 2024 divided by 1000.", "answer": "24", "url": "", "year": 2024}],
    "amc23": [{"question": "What is 3 times 9?", "answer": 27.0, "id": 0}],
    "minerva": [{"problem": "Compute $\\sqrt{16}$.", "solution": "We get $\\boxed{4}$.", "type": "Math", "idx": 0}],
    "olympiadbench": [{"id": 1, "question": "Solve $x + 1 = 3$.", "final_answer": ["$2$"], "is_multiple_answer": False}],
}


def write_all(data: Path) -> dict[str, Path]:
    """Every layout under ``data`` with the file names ``--data`` looks for."""
    files = {
        "humaneval+": humaneval_plus(data / "HumanEvalPlus-v0.1.10.jsonl.gz"),
        "mbpp+": mbpp_plus(data / "MbppPlus.jsonl"),
        "humaneval": humaneval_check(data / "HumanEval.jsonl.gz"),
        "mbpp": mbpp_asserts(data / "mbpp.jsonl"),
        "livecodebench": livecodebench(data / "livecodebench" / "test.jsonl"),
    }
    for name, rows in MATH_ROWS.items():
        files[name] = write_jsonl(data / name / "test.jsonl", rows)
    return files
