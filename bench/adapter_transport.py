"""Publishing new adapter versions to the engine replicas: through the driver (the old route) vs one
object-store put per version with a reference to every replica (the system's route), at the 7B shapes.

The real system runs on a local Ray cluster (``actors.system.System.start``: two learners of four
members each, ``--replicas`` transformers engine replicas, the league, one verifier) over a Qwen2 model
with Qwen2.5-7B's widths (hidden 3584, intermediate 18944, 28 query / 4 KV heads) and ``--layers``
decoder layers (random bfloat16 weights, the tiny test model's tokenizer and vocabulary: the LM head
carries no adapter). The adapters are the 7B preset's: rank 64, alpha 128, all seven projections, so
each holds 90,112 x 64 = 5.77 M parameters per layer (161.5 M at 28 layers, 323 MB in bfloat16).
``model.dtype`` is bfloat16, the serving dtype the learners export in.

Routes, alternated ``--repeats`` times, each publishing every member once (eight versions):

- ``object_store`` (new): ``System.publish_adapters``, the product code path.
- ``driver`` (old): the driver ``ray.get``s each version's files (as bytes, as the old export returned
  them) and passes them to each replica as an argument, so Ray serialises them once per replica.
  Both routes use today's in-memory export, so the difference is the transport alone.

Measured per route: publish latency (until every replica's engine serves every new version),
bytes the cluster's shared-memory object stores created (Ray's own counter, cumulative over all nodes),
and the bytes that cross the driver: what ``ray.get`` returns to it plus the arguments it sends,
each as Ray serialises it. Per-layer quantities scale linearly with layers, so the 28-layer values
are the measured ones x 28 / ``--layers`` (``extrapolated_28_layers``).

Run: ``python -m bench.adapter_transport [--layers 2] [--replicas 2] [--repeats 3]`` (about a minute on
2 cores; memory: the 2-layer base once in /dev/shm for the learners and once per replica, 0.9 GB each in
bfloat16, plus the object store's payloads). Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


from bench import qwen25_7b
from planning.memory_plan import ModelDims, lora_params
from learners.multi_lora import TARGET_MODULES

LAYERS_7B = qwen25_7b.LAYERS


def log(message: str) -> None:
    print(f"[adapter_transport] {message}", file=sys.stderr, flush=True)


def build_model(out: Path, layers: int) -> Path:
    """A random Qwen2 with Qwen2.5-7B's layer widths and ``layers`` decoder layers, in bfloat16."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from tinycoder import ensure_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_model("test", progress=False))
    tokenizer.save_pretrained(out)
    config = Qwen2Config(**qwen25_7b.config_json(layers, vocab_size=len(tokenizer), max_position_embeddings=1024),
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def adapter_params(layers: int) -> int:
    """Parameters of one rank-64 adapter on all seven projections of ``layers`` 7B-shaped decoder layers."""
    return lora_params(ModelDims.from_config_json(qwen25_7b.config_json(layers)), 64, TARGET_MODULES)


def store_counters() -> tuple[int, int]:
    """(objects, bytes) ever created in the cluster's shared-memory object stores."""
    import ray
    from ray._private import internal_api

    reply = internal_api.get_memory_info_reply(internal_api.get_state_from_address(ray.get_runtime_context().gcs_address))
    return reply.store_stats.cumulative_created_objects, reply.store_stats.cumulative_created_bytes


def serialized_bytes(value: Any) -> int:
    """How many bytes Ray serialises ``value`` into (what crosses a process boundary for it)."""
    from ray._private.worker import global_worker

    return global_worker.get_serialization_context().serialize(value).total_bytes


def learners(system: Any) -> list[Any]:
    return [learner for shards in system.learners.values() for learner in shards]


def publish_object_store(system: Any) -> None:
    """The system's route."""
    system.publish_adapters(all_members=True)


def object_store_driver_bytes(system: Any) -> dict[str, int]:
    """What crosses the driver on the system's route: the export results (references) it receives and the
    load arguments it sends, measured on one more export after the publish (outside its time and counters)."""
    import ray

    exports = ray.get([l.export.remote(None, system.config.model.dtype) for l in learners(system)])
    received = sum(serialized_bytes(e) for e in exports)
    sent = sum(serialized_bytes((m, ref, v)) for e in exports for m, (v, (ref,)) in e.items()) * len(system.inference)
    return {"driver_received_bytes": received, "driver_sent_bytes": sent}


def publish_through_driver(system: Any) -> dict[str, int]:
    """The old route: the driver pulls every version's bytes, then sends them to each replica."""
    import ray

    received = sent = 0
    loads = []
    for learner in learners(system):
        for member, (version, (ref,)) in ray.get(learner.export.remote(None, system.config.model.dtype)).items():
            files = {name: bytes(view) for name, view in ray.get(ref).items()}
            received += serialized_bytes(files)
            for replica in system.inference:
                sent += serialized_bytes((member, files, version))
                loads.append(replica.load_adapter_files.remote(member, files, version))
            system.versions[member] = version
    ray.get(loads)
    return {"driver_received_bytes": received, "driver_sent_bytes": sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (28 in Qwen2.5-7B; results scale linearly)")
    parser.add_argument("--replicas", type=int, default=2, help="inference engine replicas")
    parser.add_argument("--repeats", type=int, default=3, help="publishes per route (alternated)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

    import ray

    from actors.cluster import NAMESPACE
    from planning.placement import plan_placement
    from actors.system import System
    from configs import load_config

    work = Path(tempfile.mkdtemp(prefix="populora-transport-"))
    system = None
    try:
        began = time.perf_counter()
        model = build_model(work / "model", args.layers)
        log(f"model with {args.layers} 7B-wide layers built in {time.perf_counter() - began:.0f}s")
        config = load_config(None, [
            f"model.path={model}", "model.dtype=bfloat16", "model.max_seq_len=512", "lora.rank=64", "lora.alpha=128",
            "population.teachers=4", "population.students=4", "verifier.actors=1", "inference.backend=hf",
        ])
        plan = plan_placement(config)
        engine = plan.by_role("inference")[0]
        plan = replace(plan, actors=[replace(engine, name=f"inference-{i}") for i in range(args.replicas)]
                       + [a for a in plan.actors if a.role != "inference"])
        ray.init(num_cpus=4, namespace=NAMESPACE, include_dashboard=False, logging_level="WARNING",
                 object_store_memory=3 * 1024**3)
        system = System.start(config, plan, str(model))
        log(f"system up ({args.replicas} replicas) in {time.perf_counter() - began:.0f}s")
        system.publish_adapters(all_members=True)  # warm both sides (first loads allocate)
        payload = sum(
            sum(view.nbytes for view in ray.get(ref).values())
            for e in ray.get([l.export.remote(None, config.model.dtype) for l in learners(system)])
            for _version, (ref,) in e.values()
        )
        routes = {"driver": publish_through_driver, "object_store": publish_object_store}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in routes}
        for repeat in range(args.repeats):
            for name, publish in routes.items():
                objects0, bytes0 = store_counters()
                start = time.perf_counter()
                driver = publish(system)
                seconds = time.perf_counter() - start
                objects1, bytes1 = store_counters()
                driver = driver or object_store_driver_bytes(system)
                assert all(ray.get(r.adapters.remote()) == system.versions for r in system.inference)
                runs[name].append({"seconds": seconds, "store_objects": objects1 - objects0,
                                   "store_bytes": bytes1 - bytes0, **driver})
                log(f"repeat {repeat} {name}: {seconds:.2f}s, store {(bytes1 - bytes0) / 1e6:.0f} MB, "
                    f"driver {(driver['driver_received_bytes'] + driver['driver_sent_bytes']) / 1e6:.3f} MB")
    finally:
        if system is not None:
            system.stop()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    scale = LAYERS_7B / args.layers
    summary: dict[str, Any] = {}
    for name, rows in runs.items():
        through = [r["driver_received_bytes"] + r["driver_sent_bytes"] for r in rows]
        summary[name] = {
            "publish_seconds_median": round(statistics.median(r["seconds"] for r in rows), 3),
            "publish_seconds": [round(r["seconds"], 3) for r in rows],
            "driver_bytes_per_step": int(statistics.median(through)),
            "driver_received_bytes": int(statistics.median(r["driver_received_bytes"] for r in rows)),
            "driver_sent_bytes": int(statistics.median(r["driver_sent_bytes"] for r in rows)),
            "store_bytes_created": int(statistics.median(r["store_bytes"] for r in rows)),
            "store_objects_created": int(statistics.median(r["store_objects"] for r in rows)),
        }
    old, new = summary["driver"], summary["object_store"]
    result = {
        "bench": "adapter_transport",
        "layers": args.layers, "replicas": args.replicas, "adapters": 8, "rank": 64, "dtype": "bfloat16",
        "params_per_adapter": adapter_params(args.layers), "payload_bytes_per_step": payload,
        "routes": summary,
        "ratios": {
            "publish_seconds_driver_over_object_store": round(old["publish_seconds_median"] / new["publish_seconds_median"], 2),
            "driver_bytes_driver_over_object_store": round(old["driver_bytes_per_step"] / max(1, new["driver_bytes_per_step"]), 1),
            "store_bytes_driver_over_object_store": round(old["store_bytes_created"] / new["store_bytes_created"], 2),
            "object_store_copies_per_version": round(new["store_bytes_created"] / payload, 3),
        },
        "extrapolated_28_layers": {
            "params_per_adapter": adapter_params(LAYERS_7B),
            "payload_bytes_per_step": int(payload * scale),
            "driver_bytes_per_step": {"driver": int(old["driver_bytes_per_step"] * scale),
                                      "object_store": new["driver_bytes_per_step"]},  # references: independent of size
            "publish_seconds": {"driver": round(old["publish_seconds_median"] * scale, 2),
                                "object_store": round(new["publish_seconds_median"] * scale, 2)},
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
