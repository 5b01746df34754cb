"""Bounded waits for the cluster: ``run.cluster_wait_s`` seconds at most, a line every ~30 s, then a clean stop.

Every place the driver waits for the cluster goes through one :class:`ClusterWait`: a placement group to be
placed, actors to be given a node (and then to answer), the live cluster to hold the placement plan again
before a recovery. Only time spent *waiting for the cluster* counts against the bound: an actor Ray has placed
on a node and whose constructor runs (a 7B engine loading its weights) is progress, reported but not cut off; an
actor that has no node yet (the GCS records no process for it), a pending placement group, or a live cluster
that cannot hold the plan (``PlacementPlan.check`` on :func:`live_view`) is the cluster falling short. The clock
is one per ``ClusterWait`` (one per system start or recovery), summed over its waits.

While waiting, every ``interval_s`` (30 s; a third of a shorter bound) a warning names what is missing and why, e.g.::

    waiting for 1 GPU, 0.5 CPU for learner GPU 0: node 3f2a1b2c (10.0.0.7) left the cluster after step 3;
    GPU: need 2, have 1 (NOT ENOUGH); 60 of 300 s

When the bound passes, :class:`ClusterWaitError` carries the same facts; the driver stops the run with it
(status ``failed``, the cause, the ``--resume`` command). A placement group that was still pending is removed
first, so nothing is left holding or asking for resources.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group

from planning.placement import ClusterView, PlacementPlan

log = logging.getLogger("populora.cluster")

DEFAULT_BOUND_S = 300.0
"""``run.cluster_wait_s``'s default: five minutes."""


class ClusterWaitError(RuntimeError):
    """The cluster did not provide what the run waited for within ``run.cluster_wait_s``."""


def live_view(source: str = "the live cluster") -> ClusterView:
    """The nodes alive now and their total resources (``ray.nodes()``), as the placement check reads a cluster."""
    nodes = [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]
    total: dict[str, float] = {}
    for node in nodes:
        for key, amount in node.items():
            total[key] = total.get(key, 0.0) + float(amount)
    return ClusterView(total=total, nodes=nodes, source=source)


def node_label(node: Mapping[str, Any]) -> str:
    """``node 3f2a1b2c (10.0.0.7)``: the first 8 hex digits of its id and its address."""
    return f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '?')})"


def alive_node_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def actor_record(handle: Any) -> dict[str, Any]:
    """The GCS's record of an actor (``State``: PENDING_CREATION, ALIVE, RESTARTING, DEAD; ``Pid`` 0 until Ray
    gives it a worker process); read from Ray's actor table, which needs no dashboard and no call on the actor."""
    return ray._private.state.actors(handle._actor_id.hex()) or {}


def actor_placed(handle: Any) -> bool:
    """Whether Ray has given the actor a worker process on some node (the GCS records its pid); a dead actor
    counts as placed (waiting on it fails at once, with the actor's own error)."""
    info = actor_record(handle)
    return bool(info) and (info.get("State") == "DEAD" or bool(info.get("Pid")))


def resources_text(amounts: Mapping[str, float]) -> str:
    """``1 GPU, 0.5 CPU``: the non-zero amounts, GPUs first."""
    keys = sorted((k for k, v in amounts.items() if v), key=lambda k: (k != "GPU", k != "CPU", k))
    return ", ".join(f"{amounts[k]:g} {k}" for k in keys) or "no resources"


class ClusterWait:
    """One bound on the time a system start (or recovery) spends waiting for the cluster (module docstring).

    ``known_nodes``: the node ids alive when the run last had its full set of actors; those no longer alive are
    named as lost. ``context``: when they were lost, e.g. ``after step 3``."""

    def __init__(self, bound_s: float = DEFAULT_BOUND_S, plan: PlacementPlan | None = None,
                 known_nodes: set[str] | None = None, context: str = "", interval_s: float | None = None):
        self.bound_s, self.plan, self.context = float(bound_s), plan, context
        # a line every 30 s; a short bound gets at least three
        self.interval_s = float(interval_s) if interval_s is not None else min(30.0, max(2.0, self.bound_s / 3))
        self.known_nodes = set(known_nodes) if known_nodes is not None else alive_node_ids()
        self.waited_s = 0.0  # time the cluster fell short, summed over this instance's waits

    # what is missing -------------------------------------------------------------------------------
    def lost_nodes(self) -> list[str]:
        """Labels of the known nodes that are no longer alive."""
        return [node_label(n) for n in ray.nodes() if n["NodeID"] in self.known_nodes and not n.get("Alive")]

    def short_resources(self) -> list[str]:
        """``PlacementPlan.check``'s lines that the live cluster cannot meet (empty without a plan or when it fits)."""
        if self.plan is None:
            return []
        _, lines = self.plan.check(live_view())
        return [line for line in lines if "NOT ENOUGH" in line]

    def reason(self) -> str:
        """Why the cluster falls short, as far as the driver can see: lost nodes and the resources short."""
        lost = self.lost_nodes()
        parts = [f"{', '.join(lost)} left the cluster{' ' + self.context if self.context else ''}"] if lost else []
        parts += self.short_resources()
        return "; ".join(parts) or "the cluster has the resources in total, but not free where they are needed"

    def _progress(self, what: str) -> str:
        return f"{what}: {self.reason()}; {self.waited_s:.0f} of {self.bound_s:.0f} s (run.cluster_wait_s)"

    def _expired(self, what: str) -> ClusterWaitError:
        return ClusterWaitError(
            f"the cluster did not provide {what} within run.cluster_wait_s={self.bound_s:g} s: {self.reason()}")

    # waits -----------------------------------------------------------------------------------------
    def until_fits(self, what: str = "the resources of the placement plan") -> None:
        """Return once the live cluster can hold the plan (``PlacementPlan.check``); a node may still join within
        the bound (an autoscaler, a machine restarting). Raises ``ClusterWaitError`` when the bound passes."""
        if self.plan is None:
            return
        last = time.monotonic()
        said = last
        while self.short_resources():
            if self.waited_s >= self.bound_s:
                raise self._expired(what)
            time.sleep(min(1.0, self.interval_s))
            now = time.monotonic()
            self.waited_s, last = self.waited_s + (now - last), now
            if now - said >= self.interval_s:
                log.warning(self._progress(f"waiting for {what}"))
                said = now

    def placement_group(self, group: Any, what: str, amounts: Mapping[str, float]) -> None:
        """Wait until ``group`` is placed; on the bound, remove it and raise ``ClusterWaitError``."""
        try:
            self.get([group.ready()], {}, f"{resources_text(amounts)} for {what}", pending_all=True)
        except BaseException:
            remove_placement_group(group)
            raise

    def get(self, refs: Sequence[Any], actors: Mapping[str, Any], what: str, pending_all: bool = False) -> list[Any]:
        """``ray.get(refs)`` where the refs are calls on ``actors`` (name -> handle): the clock runs while some of
        those actors has no node yet (``pending_all``: all the time, for a placement group), with a line every
        ``interval_s`` (placed actors still starting are reported too, without a bound). An actor's own error
        (it died, its constructor raised) is raised as ``ray.get`` raises it."""
        refs = list(refs)
        remaining, last = refs, time.monotonic()
        said = last
        while True:
            _, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=min(1.0, self.interval_s))
            now = time.monotonic()
            if not remaining:
                break
            unplaced = list(actors) if pending_all else [name for name, h in actors.items() if not actor_placed(h)]
            if unplaced or pending_all:
                self.waited_s += now - last
                if self.waited_s >= self.bound_s:
                    raise self._expired(what)
            last = now
            if now - said >= self.interval_s:
                said = now
                if unplaced or pending_all:
                    log.warning(self._progress(f"waiting for {what}"
                                               + (f" ({', '.join(unplaced)} not placed yet)" if unplaced else "")))
                else:
                    log.warning(f"waiting for {what}: every actor is placed and starting (no bound while they load)")
        return ray.get(refs)
