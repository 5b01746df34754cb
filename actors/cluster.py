"""Starting or attaching to Ray, and creating the named actors of a placement plan.

Every actor lives in namespace ``populora`` under the name the plan gives it, so the dashboard and
``ray list actors`` show them by role. A local cluster started here binds loopback only.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from actors.placement import ActorPlan, PlacementPlan

NAMESPACE = "populora"
log = logging.getLogger(__name__)


def connect(num_cpus_needed: float) -> str:
    """Attach to ``RAY_ADDRESS`` (set by ``ray job submit``) or start a local loopback-only cluster.

    Returns a description of what it connected to.
    """
    if ray.is_initialized():
        return "the Ray session already running in this process"
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING")
        return f"Ray cluster at {address}"
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every listener on 127.0.0.1
    cpus = max(float(os.cpu_count() or 1), num_cpus_needed)
    ray.init(
        namespace=NAMESPACE,
        num_cpus=int(cpus + 0.999),
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        logging_level="WARNING",
    )
    return f"a local Ray cluster ({cpus:g} CPUs, dashboard http://127.0.0.1:8265)"


def verifier_nodes(resource: str) -> int:
    """Alive nodes that carry the verifier resource."""
    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) > 0)


def actor_options(plan: PlacementPlan, actor: ActorPlan, learner_groups: dict[int, Any]) -> dict[str, Any]:
    """``.options(...)`` for one planned actor: its name, resources and restart policy (Ray restarts only verifiers).

    Verifiers request the custom resource only when some node carries it (else the head's CPUs).
    Learners that share a GPU are put in one placement-group bundle so they land on the same GPU.
    """
    options: dict[str, Any] = {
        "name": actor.name,
        "namespace": NAMESPACE,
        "num_cpus": actor.num_cpus,
        "num_gpus": actor.num_gpus,
        # Verifiers are stateless: Ray restarts them and the pool resubmits. The stateful actors are never
        # restarted by Ray (a restart would come back with fresh state); the driver recovers them instead.
        "max_restarts": -1 if actor.role == "verifier" else 0,
        "lifetime": None,
    }
    if actor.role == "verifier" and verifier_nodes(plan.verifier_resource):
        options["resources"] = dict(actor.resources)
    if actor.role.startswith("learner") and actor.gpu_ids:
        group = learner_groups.get(actor.gpu_ids[0])
        if group is None:
            group = placement_group([{"GPU": 1.0, "CPU": 2 * actor.num_cpus}], strategy="STRICT_PACK")
            ray.get(group.ready())
            learner_groups[actor.gpu_ids[0]] = group
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    return options
