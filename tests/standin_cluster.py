"""Several Ray nodes on one machine (``ray.cluster_utils``) in the CPU stand-in mode: logical GPUs, CPU paths."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.cluster_utils import Cluster

from actors.cluster import GPU_STANDIN_ENV, NAMESPACE


@contextmanager
def standin_cluster(head: dict[str, Any], workers: tuple[dict[str, Any], ...] = ()) -> Iterator[Cluster]:
    """A cluster of a head (``head``: ``num_cpus``, ``num_gpus``) and ``workers``, whose raylets, and so every worker
    process, start with ``POPULORA_GPU_STANDIN=1`` (actors given a logical GPU run their CPU path); this process is
    attached to it in namespace ``populora``. Shut down, and the variable restored, at the end."""
    saved = os.environ.get(GPU_STANDIN_ENV)
    os.environ[GPU_STANDIN_ENV] = "1"
    cluster = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
    try:
        for worker in workers:
            cluster.add_node(**worker)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace=NAMESPACE, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop(GPU_STANDIN_ENV, None)
        else:
            os.environ[GPU_STANDIN_ENV] = saved
