"""What a learner keeps on its GPU between updates, against the colocated memory plan's ``generating`` row.

In the colocated layout (docs/memory.md) a GPU's engine wakes beside its learners after they have returned their
cached blocks (``LearnerActor.release_memory``: ``gc.collect()``, ``torch.cuda.empty_cache()``). The plan counts
what stays on the GPU (``planning.memory_plan.learner_resident_bytes``): the base, 12 B per adapter parameter
(float32 master weights and AdamW's two moments; the optimizer step sets the gradients to None) and the cached
blocks the release cannot return (a segment holding any live block stays), a measured share of the step's
transient bytes (``RELEASE_RETAINED_FRACTION``, fitted to this bench's runs). This bench builds the 7B-shaped
learner of ``bench/memory_plan.py`` (``--layers`` decoder layers of Qwen2.5-7B's widths, ``--slots`` rank-64
adapters), runs ``--steps`` real steps of one micro-batch, releases the cache as the learner actor does, and
compares ``torch.cuda.memory_reserved()`` (what the engine cannot have) with the plan. It also reports what was
allocated (live tensors), and reserved before the release (what the engine would lose without it).
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in the environment measures that allocator instead (the
learners do not use it).

CUDA only. The last stdout line is one JSON object: planned and measured bytes, the retained share of the step
(``retained_share``), ``reserved_over_planned`` and ``within_goal`` (the plan never under what stays reserved, and
within 15% of it).
Run: ``python -m bench.colocated_memory --layers 28 --tokens 16384``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys


from bench import qwen25_7b
from bench.memory_plan import build, shape_of  # the same 7B-shaped learner
from planning.memory_plan import ModelDims, learner_resident_bytes, step_peak_bytes

GOAL = 0.15
CHUNK = 1024


def planned(layers: int, slots: int, tokens: int) -> dict[str, int]:
    """The ``generating`` row's learner part for this bench's learner (CUDA context aside): the base and
    ``learner_resident_bytes``; and the step's transient bytes the retained share is a share of."""
    dims = ModelDims.from_config_json(qwen25_7b.config_json(layers))
    shape = shape_of(slots, tokens, True, CHUNK, 2, "cuda")
    return {"planned": dims.base_params() * 2 + sum(learner_resident_bytes(dims, shape).values()),
            "base_and_state": dims.base_params() * 2 + learner_resident_bytes(dims, shape)["adapters (fp32 weights, AdamW moments)"],
            "step_transient": step_peak_bytes(dims, shape)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/colocated_memory.py measures the CUDA caching allocator: it needs a GPU")
    spec = {"device": "cuda", "dtype": "bfloat16", "layers": args.layers, "slots": args.slots, "tokens": args.tokens,
            "checkpointing": True, "chunk": CHUNK, "threads": 4}
    learner, samples, _ = build(spec)
    for _ in range(args.steps):
        learner.step(samples)
    torch.cuda.synchronize()
    kept = {"allocated": torch.cuda.memory_allocated(), "reserved_before_release": torch.cuda.memory_reserved(),
            "peak_allocated": torch.cuda.max_memory_allocated()}
    gc.collect()
    torch.cuda.empty_cache()  # what LearnerActor.release_memory does before the engine wakes
    kept["reserved"] = torch.cuda.memory_reserved()
    plan = planned(args.layers, args.slots, args.tokens)
    ratio = kept["reserved"] / plan["planned"]
    print(json.dumps({"device": torch.cuda.get_device_name(0), **vars(args),
                      "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"), **plan, **kept,
                      "retained_share": round((kept["reserved"] - plan["base_and_state"]) / plan["step_transient"], 4),
                      "reserved_over_planned": round(ratio, 4), "within_goal": 1 / (1 + GOAL) <= ratio <= 1.0}))


if __name__ == "__main__":
    main()
