"""The verifier pool: sandbox actors on CPU workers, and a driver-side dispatcher that loses no task.

Work is cut into chunks and spread over the live verifier actors. A chunk whose actor dies (killed,
node lost) is resubmitted, to the restarted actor or another one, until it gets verdicts, so a dead
verifier costs time, never tasks. Verdicts are pure functions of (program, input), so a retried
chunk gives the same answers.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

log = logging.getLogger(__name__)


@ray.remote(max_restarts=-1)
class VerifierActor:
    """A thin shell over :class:`verifier.Verifier`: one warm fork server per actor.

    ``require`` (``verifier.require``) names the defences its machine must provide; without them
    the actor does not start (``WeakSandboxError`` lists what is missing and how to enable it).
    ``allow_weak_sandbox`` (``verifier.allow_weak_sandbox``) starts it anyway, warning on every start.
    """

    def __init__(
        self,
        timeout_s: float,
        memory_mb: int,
        max_output_chars: int,
        workers: int,
        require: Sequence[str] | None = None,
        allow_weak_sandbox: bool = False,
    ):
        from actors.cluster import route_actor_output

        route_actor_output("verifier")  # the fork server inherits it
        from verifier import Verifier
        from verifier.defences import DEFAULT_REQUIRE

        self.verifier = Verifier(
            timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars, workers=workers,
            require=DEFAULT_REQUIRE if require is None else tuple(require), allow_weak=allow_weak_sandbox,
        )
        if allow_weak_sandbox:
            log.warning("verifier actor started with allow_weak_sandbox: the sandbox requirements are not enforced")
        self.executions = 0
        from actors.telemetry import VerifierMetrics

        self.metrics = VerifierMetrics()

    def __repr__(self) -> str:  # the driver's log prefix
        return f"VerifierActor({ray.get_runtime_context().get_actor_name()})"

    def validate(self, family: str, proposals: list[Any], n_inputs: int) -> list[Any]:
        from verifier.families import validate_proposals

        start = time.perf_counter()
        out = validate_proposals(self.verifier, family, proposals, n_inputs=n_inputs)
        self.metrics.observe(len(proposals), time.perf_counter() - start)
        return out

    def judge(self, items: list[tuple[Any, str]]) -> list[Any]:
        from verifier.families import judge_answers

        start = time.perf_counter()
        out = judge_answers(self.verifier, items)
        self.metrics.observe(len(items), time.perf_counter() - start)
        return out

    def execute_many(self, items: list[tuple[str, str]]) -> list[Any]:
        start = time.perf_counter()
        out = self.verifier.execute_many(items)
        self.metrics.observe(len(items), time.perf_counter() - start)
        return out

    def defences(self) -> dict[str, Any]:
        return self.verifier.defences()

    def close(self) -> None:
        """Stop the fork server and remove its scratch directory."""
        self.verifier.close()


class VerifierPool:
    """Dispatches chunks of verifier work over named actors and retries chunks of dead ones."""

    def __init__(self, actors: Sequence[Any], chunk_size: int = 16, max_attempts: int = 20):
        self.actors = list(actors)
        self.chunk_size = chunk_size
        self.max_attempts = max_attempts
        self.retried_chunks = 0

    def map(self, call: Callable[[Any, list[Any]], Any], items: Sequence[Any]) -> list[Any]:
        """``call(actor, chunk)`` (returning an ObjectRef of a list) over ``items``, results in order."""
        chunks = [list(items[i : i + self.chunk_size]) for i in range(0, len(items), self.chunk_size)]
        results: list[list[Any] | None] = [None] * len(chunks)
        attempts = [0] * len(chunks)
        pending: dict[Any, int] = {}

        def submit(index: int) -> None:
            actor = self.actors[(index + attempts[index]) % len(self.actors)]
            attempts[index] += 1
            pending[call(actor, chunks[index])] = index

        for index in range(len(chunks)):
            submit(index)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            index = pending.pop(ready[0])
            try:
                results[index] = ray.get(ready[0])
            except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                if attempts[index] >= self.max_attempts:
                    raise RuntimeError(f"verifier chunk failed {attempts[index]} times; last error: {exc}") from exc
                self.retried_chunks += 1
                log.warning("verifier died mid-batch (%s); resubmitting its %d items", type(exc).__name__, len(chunks[index]))
                time.sleep(min(0.5 * attempts[index], 5.0))
                submit(index)
        return [item for chunk in results for item in chunk]  # type: ignore[union-attr]
