"""Actor-level checks on real Ray clusters: verifier placement on nodes with the verifier resource
(multi-node simulation), a verifier killed mid-batch loses no task, named actors in the state API."""

from __future__ import annotations

import threading
import time

import ray
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from actors.cluster import NAMESPACE, actor_options
from planning.placement import plan_placement
from actors.verifier_pool import VerifierActor, VerifierPool
from configs import load_config

SLOW_PROGRAM = "def f(n):\n    total = 0\n    for i in range(n):\n        total += i * i\n    return total"


def start_verifiers(config, plan):
    return [
        VerifierActor.options(**actor_options(plan, a, {})).remote(
            config.verifier.timeout_s, config.verifier.memory_mb, config.verifier.max_output_chars, 1
        )
        for a in plan.by_role("verifier")
    ]


def test_verifiers_land_only_on_nodes_with_the_verifier_resource():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})  # list_actors asks the dashboard
    worker = cluster.add_node(num_cpus=2, resources={"verifier": 4})
    try:
        ray.init(address=cluster.address, namespace=NAMESPACE)
        config = load_config(None, ["verifier.actors=3", "verifier.cpus_per_actor=0.5"])
        plan = plan_placement(config)
        actors = start_verifiers(config, plan)
        ray.get([a.defences.remote() for a in actors])
        rows = [a for a in list_actors(filters=[("state", "=", "ALIVE")]) if a.name.startswith("verifier-")]
        assert sorted(a.name for a in rows) == ["verifier-0", "verifier-1", "verifier-2"]
        assert {a.node_id for a in rows} == {worker.node_id}
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_verifiers_fall_back_to_the_head_without_the_resource_and_are_named():
    ray.init(address="local", num_cpus=2, namespace=NAMESPACE, include_dashboard=False)
    try:
        config = load_config(None, ["verifier.actors=2"])
        actors = start_verifiers(config, plan_placement(config))
        ray.get([a.defences.remote() for a in actors])
        names = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE}
        assert {"verifier-0", "verifier-1"} <= names
    finally:
        ray.shutdown()


def test_a_verifier_killed_mid_batch_loses_no_task():
    ray.init(address="local", num_cpus=2, namespace=NAMESPACE, include_dashboard=False)
    try:
        config = load_config(None, ["verifier.actors=2", "verifier.timeout_s=60"])  # a loaded CI box is slow
        actors = start_verifiers(config, plan_placement(config))
        ray.get([a.defences.remote() for a in actors])
        items = [(SLOW_PROGRAM, str(300_000 + i)) for i in range(160)]
        pool = VerifierPool(actors, chunk_size=4)

        def kill_soon() -> None:
            time.sleep(1.0)
            ray.kill(actors[0], no_restart=False)

        killer = threading.Thread(target=kill_soon)
        killer.start()
        results = pool.map(lambda a, chunk: a.execute_many.remote(chunk), items)
        killer.join()
        assert pool.retried_chunks >= 1, "the kill should have hit a chunk in flight"
        assert len(results) == len(items)
        assert [r.status.name for r in results] == ["OK"] * len(items), [r.error for r in results if not r.ok][:3]
        expected = [str(sum(i * i for i in range(int(args)))) for _, args in items]
        assert [r.output for r in results] == expected
    finally:
        ray.shutdown()
