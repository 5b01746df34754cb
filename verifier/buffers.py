"""Task buffers: a FIFO-capped store per family, K-reference sampling, seeding, JSON state.

AZR keeps the first ``max_programs`` entries once full (new programs are dropped); we evict the
oldest instead (FIFO), so the buffers follow the population. A buffer starts from AZR's identity
seed (``def f(a): return a`` on ``'Hello world'``) or from a seed file of Task dicts (JSONL).
"""

from __future__ import annotations

import json
import random
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from verifier.tasks import FAMILIES, Task, check_family, identity_task


class TaskBuffer:
    """At most ``capacity`` tasks, oldest evicted first."""

    def __init__(self, capacity: int, seed_tasks: Iterable[Task] = ()):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._tasks: deque[Task] = deque(maxlen=capacity)
        self.added = 0  # tasks ever added, seeds included
        self.extend(seed_tasks)

    def add(self, task: Task) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"a TaskBuffer holds Task objects, got {type(task).__name__}")
        self._tasks.append(task)
        self.added += 1

    def extend(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            self.add(task)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks))

    def sample(self, k: int, rng: random.Random) -> list[Task]:
        """``min(k, len)`` tasks drawn uniformly without replacement (AZR's K references)."""
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        return rng.sample(list(self._tasks), min(k, len(self._tasks)))

    def recent(self, n: int) -> list[Task]:
        """The ``n`` most recently added tasks, newest last."""
        return list(self._tasks)[-n:] if n > 0 else []

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state; ``load_state_dict`` restores it."""
        return {"capacity": self.capacity, "added": self.added, "tasks": [t.to_dict() for t in self._tasks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not {"capacity", "tasks"} <= set(state):
            raise ValueError("a TaskBuffer state needs 'capacity' and 'tasks'")
        capacity = int(state["capacity"])
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        tasks = [Task.from_dict(d) for d in state["tasks"]]
        self.capacity = capacity
        self._tasks = deque(tasks, maxlen=capacity)
        self.added = int(state.get("added", len(tasks)))


def load_seed_file(path: str | Path) -> list[Task]:
    """Tasks from a JSONL file of ``Task.to_dict()`` records; bad lines raise ``ValueError`` with the line number."""
    tasks = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.from_dict(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a task record: {exc}") from None
    return tasks


def seed_tasks(family: str, seed_file: str | Path | None = None) -> list[Task]:
    """Seeds of one family's buffer. From a seed file, code_o and code_i records seed both the
    code_o and the code_i buffer (AZR initialises both from one set); a family without records
    gets the identity seed."""
    check_family(family)
    if seed_file is None:
        return [identity_task(family)]
    io = family in ("code_o", "code_i")
    chosen = [
        Task(family, t.program, t.inputs, t.outputs, t.message, dict(t.meta))
        for t in load_seed_file(seed_file)
        if (t.family in ("code_o", "code_i")) == io
    ]
    return chosen or [identity_task(family)]


def make_buffers(capacity: int, seed_file: str | Path | None = None, families: Sequence[str] = FAMILIES) -> dict[str, TaskBuffer]:
    """One seeded ``TaskBuffer`` per family."""
    return {family: TaskBuffer(capacity, seed_tasks(family, seed_file)) for family in families}


def sample_program(buffers: Sequence[TaskBuffer], rng: random.Random) -> str:
    """One program drawn uniformly from the union of ``buffers`` (AZR: a code_f teacher probes a
    program from the code_i and code_o buffers)."""
    pool = [t.program for b in buffers for t in b]
    if not pool:
        raise ValueError("no program to sample: the buffers are empty")
    return rng.choice(pool)
