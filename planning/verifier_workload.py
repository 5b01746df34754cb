"""The verifier's workload for measuring it: typical AZR proposals and a timed run of them on the real sandbox.

``make_tasks`` gives (program, args) pairs from templates of a few lines to a few dozen (the allowed modules,
classes, recursion); ``timed_execute`` runs each twice, as the verifier's determinism check does, and times it. The
calibration (``python -m planning.calibrate``) files tasks per second per worker as ``host.verifier_tasks_per_core_s``;
the sandbox benchmark (``python -m bench.sandbox``) runs the same tasks against a naive interpreter per call.
"""

from __future__ import annotations

import random
import time

from verifier.sandbox import Verifier

# Typical AZR proposals: a few lines to a few dozen, the allowed modules, classes, recursion.
TEMPLATES = [
    ("def f(s: str, k: int):\n    out = []\n    for i, ch in enumerate(s):\n        if ch.isalpha():\n"
     "            base = ord('a') if ch.islower() else ord('A')\n            out.append(chr((ord(ch) - base + k * (i % 3 + 1)) % 26 + base))\n"
     "        else:\n            out.append(ch)\n    return ''.join(out)", lambda r: f"{r.choice(['Hello world', 'abc XYZ', 'Zebra!'])!r}, {r.randint(1, 9)}"),
    ("from collections import Counter, defaultdict\n\ndef f(words):\n    counts = Counter(words)\n    groups = defaultdict(list)\n"
     "    for w, c in counts.items():\n        groups[c].append(w)\n    return sorted((c, sorted(ws)) for c, ws in groups.items())",
     lambda r: repr([r.choice(["a", "b", "cc", "d", "ee"]) for _ in range(r.randint(3, 12))])),
    ("import heapq\n\ndef f(edges, start):\n    graph = {}\n    for a, b, w in edges:\n        graph.setdefault(a, []).append((b, w))\n"
     "        graph.setdefault(b, []).append((a, w))\n    dist = {start: 0}\n    heap = [(0, start)]\n    while heap:\n"
     "        d, node = heapq.heappop(heap)\n        if d > dist.get(node, float('inf')):\n            continue\n"
     "        for nxt, w in graph.get(node, []):\n            nd = d + w\n            if nd < dist.get(nxt, float('inf')):\n"
     "                dist[nxt] = nd\n                heapq.heappush(heap, (nd, nxt))\n    return sorted(dist.items())",
     lambda r: f"{[(r.randint(0, 5), r.randint(0, 5), r.randint(1, 9)) for _ in range(r.randint(3, 8))]!r}, 0"),
    ("from functools import lru_cache\n\ndef f(n: int, m: int):\n    @lru_cache(maxsize=None)\n    def paths(i, j):\n"
     "        if i == 0 or j == 0:\n            return 1\n        return paths(i - 1, j) + paths(i, j - 1)\n    return paths(n, m) % 1000007",
     lambda r: f"{r.randint(2, 30)}, {r.randint(2, 30)}"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n"
     "    def pop(self):\n        return self.items.pop() if self.items else None\n\n\ndef f(ops):\n    s = Stack()\n    out = []\n"
     "    for op in ops:\n        if op == 'pop':\n            out.append(s.pop())\n        else:\n            s.push(op)\n    return out",
     lambda r: repr([r.choice(["pop", 1, 2, "x", 3]) for _ in range(r.randint(2, 10))])),
    ("import itertools\n\ndef f(xs, k):\n    best = None\n    for combo in itertools.combinations(xs, k):\n        s = sum(combo)\n"
     "        if s % 2 == 0 and (best is None or s > best[0]):\n            best = (s, combo)\n    return best",
     lambda r: f"{[r.randint(-5, 20) for _ in range(r.randint(3, 7))]!r}, {r.randint(1, 3)}"),
    ("import re\n\ndef f(text):\n    tokens = re.findall(r'[A-Za-z]+|\\d+', text)\n    nums = [int(t) for t in tokens if t.isdigit()]\n"
     "    words = [t.lower() for t in tokens if t.isalpha()]\n    return {'sum': sum(nums), 'words': sorted(set(words))}",
     lambda r: repr(r.choice(["a1 b22 C3", "x 10 y 20 z", "The 3 little pigs 7"]))),
    ("from dataclasses import dataclass\nfrom typing import List\n\n@dataclass\nclass Item:\n    name: str\n    weight: int\n    value: int\n\n"
     "def f(items: List[tuple], cap: int):\n    objs = [Item(*t) for t in items]\n    dp = [0] * (cap + 1)\n    for it in objs:\n"
     "        for c in range(cap, it.weight - 1, -1):\n            dp[c] = max(dp[c], dp[c - it.weight] + it.value)\n    return dp[cap]",
     lambda r: f"{[('i%d' % k, r.randint(1, 6), r.randint(1, 10)) for k in range(r.randint(2, 6))]!r}, {r.randint(5, 15)}"),
    ("def f(n):\n    def collatz(x):\n        steps = 0\n        while x != 1:\n            x = x // 2 if x % 2 == 0 else 3 * x + 1\n"
     "            steps += 1\n        return steps\n    return max(range(1, n + 1), key=collatz)", lambda r: str(r.randint(5, 300))),
    ("import math\nfrom fractions import Fraction\n\ndef f(a, b):\n    g = math.gcd(a, b)\n    fr = Fraction(a, b)\n"
     "    return (g, fr.numerator, fr.denominator, round(math.sqrt(a * b), 3))", lambda r: f"{r.randint(1, 500)}, {r.randint(1, 500)}"),
    ("def f(matrix):\n    rows, cols = len(matrix), len(matrix[0])\n    out = []\n    top, bottom, left, right = 0, rows - 1, 0, cols - 1\n"
     "    while top <= bottom and left <= right:\n        out.extend(matrix[top][left:right + 1])\n        for i in range(top + 1, bottom + 1):\n"
     "            out.append(matrix[i][right])\n        if top < bottom:\n            out.extend(matrix[bottom][left:right][::-1])\n"
     "        if left < right:\n            for i in range(bottom - 1, top, -1):\n                out.append(matrix[i][left])\n"
     "        top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1\n    return out",
     lambda r: repr([[r.randint(0, 9) for _ in range(3)] for _ in range(r.randint(1, 4))])),
    ("from collections import deque\n\ndef f(grid):\n    h, w = len(grid), len(grid[0])\n    seen = set()\n    regions = 0\n"
     "    for i in range(h):\n        for j in range(w):\n            if grid[i][j] == '#' and (i, j) not in seen:\n                regions += 1\n"
     "                q = deque([(i, j)])\n                seen.add((i, j))\n                while q:\n                    a, b = q.popleft()\n"
     "                    for da, db in ((1, 0), (-1, 0), (0, 1), (0, -1)):\n                        na, nb = a + da, b + db\n"
     "                        if 0 <= na < h and 0 <= nb < w and grid[na][nb] == '#' and (na, nb) not in seen:\n"
     "                            seen.add((na, nb))\n                            q.append((na, nb))\n    return regions",
     lambda r: repr(["".join(r.choice("#.") for _ in range(5)) for _ in range(4)])),
]


def make_tasks(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (program, args) pairs: the templates with varied inputs and an extra constant so
    no two programs are byte-identical."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        program, make_args = TEMPLATES[i % len(TEMPLATES)]
        tasks.append((f"{program}\n\nVERSION = {i}\n", make_args(rng)))
    return tasks


def timed_execute(verifier: Verifier, tasks: list[tuple[str, str]]) -> tuple[list, float]:
    """Each task run twice (the determinism check) on a started ``verifier``, after a warm-up of 20: the results
    and the wall seconds. Tasks per second per worker is the time plan's ``host.verifier_tasks_per_core_s``
    (``planning.calibrate``)."""
    verifier.execute_many(tasks[:20])  # warm the reader thread and caches
    start = time.perf_counter()
    results = verifier.execute_many(tasks)
    return results, time.perf_counter() - start
