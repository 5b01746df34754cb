"""The whole plan of a run, asked for once: where each actor goes and whether its memory fits (pure, no Ray).

``launch.py`` reads the cluster and this machine (``ClusterView``, ``HostView``: the only probing, which stays
there) and calls :func:`plan_run` once; the dry run prints the result and a real run refuses on it before any
actor starts. The parts are ``planning.placement`` and ``planning.memory_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configs.schema import Config
from planning.memory_plan import GiB, HostView, MemoryPlan, PlanInputError, load_model_dims, plan_memory
from planning.placement import ClusterView, PlacementPlan, plan_placement

DEFAULT_GPU_GIB = 80.0


@dataclass
class RunPlan:
    """What :func:`plan_run` found: the placement and how it meets the cluster, and the memory plan."""

    placement: PlacementPlan
    view: ClusterView
    resources_fit: bool
    resource_lines: list[str] = field(default_factory=list)  # ``PlacementPlan.check``'s lines for ``view``
    memory: MemoryPlan | None = None
    memory_problem: str | None = None  # why there is no memory plan (the model's config.json cannot be read)

    def missing_resources(self) -> list[str]:
        """The resource lines ``view`` cannot meet (empty when it fits). A local cluster started here is given as
        many CPUs as the plan asks for (``actors.cluster.connect``), so only its GPUs can fall short."""
        if self.resources_fit:
            return []
        short = [line for line in self.resource_lines if "NOT ENOUGH" in line or "largest node" in line]
        if not self.view.source.startswith("Ray cluster"):
            short = [line for line in short if not line.startswith("CPU:")]
        return short


def gpu_capacity(config: Config, view: ClusterView) -> tuple[int, str]:
    """Bytes per GPU for the memory plan and where they come from: the config, else the cluster, else 80 GiB."""
    if config.resources.gpu_memory_gib is not None:
        gpu_bytes, source = int(config.resources.gpu_memory_gib * GiB), "resources.gpu_memory_gib"
    elif view.gpu_memory_bytes:
        gpu_bytes, source = view.gpu_memory_bytes, f"nvidia-smi on {view.source}"
    else:
        gpu_bytes, source = int(DEFAULT_GPU_GIB * GiB), "default (set resources.gpu_memory_gib)"
    return gpu_bytes, f"{gpu_bytes / GiB:.1f} GiB per GPU, {source}"


def plan_run(config: Config, view: ClusterView, host: HostView) -> RunPlan:
    """The placement of ``config`` checked against ``view``, and its memory plan on ``host`` and ``view``'s GPUs
    (``memory_problem`` says why there is none: a ``PlanInputError``)."""
    placement = plan_placement(config)
    fits, lines = placement.check(view)
    plan = RunPlan(placement=placement, view=view, resources_fit=fits, resource_lines=lines)
    gpu_bytes, source = gpu_capacity(config, view)
    try:
        plan.memory = plan_memory(config, load_model_dims(config), placement, gpu_bytes, host, source)
    except PlanInputError as exc:
        plan.memory_problem = str(exc)
    return plan
