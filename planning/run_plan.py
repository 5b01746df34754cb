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
from planning.constants_file import ConstantsFileError, constants_for, read_constants_file
from planning.time_constants import DEVICE_KINDS, HOST, ConstantsError, with_overrides
from planning.lengths import Lengths, lengths_from_config
from planning.time_plan import (ClusterError, Layout, LayoutChoice, choose_layout, cluster_of, config_layout,
                                described_gpu_bytes)

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
    time: LayoutChoice | None = None
    time_problem: str | None = None  # why there is no time plan, or why the layout cannot be the described cluster's
    time_input_error: bool = False  # the problem is bad input (--cluster, plan.constants), not a layout that is too big
    constants_lines: list[str] = field(default_factory=list)  # plan.constants_file: its source, what was ignored and why

    def missing_resources(self) -> list[str]:
        """The resource lines ``view`` cannot meet (empty when it fits). A local cluster started here is given as
        many CPUs as the plan asks for (``actors.cluster.connect``), so only its GPUs can fall short."""
        if self.resources_fit:
            return []
        short = [line for line in self.resource_lines if "NOT ENOUGH" in line]
        if not self.view.source.startswith("Ray cluster"):
            short = [line for line in short if not line.startswith("CPU:")]
        return short


def gpu_capacity(config: Config, view: ClusterView, described: str | None = None) -> tuple[int, str]:
    """Bytes per GPU for the memory plan and where they come from: the config, else the cluster, else the described
    cluster's GPU kind (``--cluster``, else ``plan.gpu_kind``) where ``planning.time_constants`` knows it, else 80 GiB."""
    try:
        kind = DEVICE_KINDS.get(cluster_of(config, described).kind)
    except ClusterError:  # reported by the time plan
        kind = None
    if config.resources.gpu_memory_gib is not None:
        gpu_bytes, source = int(config.resources.gpu_memory_gib * GiB), "resources.gpu_memory_gib"
    elif view.gpu_memory_bytes:
        gpu_bytes, source = view.gpu_memory_bytes, f"nvidia-smi on {view.source}"
    elif kind is not None and kind.name != "cpu":
        gpu_bytes, source = int(kind.memory_gib * GiB), f"the described {kind.name} (set resources.gpu_memory_gib)"
    else:
        gpu_bytes, source = int(DEFAULT_GPU_GIB * GiB), "default (set resources.gpu_memory_gib)"
    return gpu_bytes, f"{gpu_bytes / GiB:.1f} GiB per GPU, {source}"


def plan_run(config: Config, view: ClusterView, host: HostView, cluster: str | None = None,
             lengths: Lengths | None = None, installed: dict[str, str | None] | None = None) -> RunPlan:
    """The placement of ``config`` checked against ``view``, its memory plan on ``host`` and ``view``'s GPUs
    (``memory_problem`` says why there is none: a ``PlanInputError``), and its time plan on the described
    cluster (``cluster``: ``--cluster`` text, else the config's ``plan`` block; ``lengths``: a run's, else the
    config's; ``installed``: the torch/transformers/vllm versions ``plan.constants_file`` is checked against, default
    those installed here)."""
    placement = plan_placement(config)
    fits, lines = placement.check(view)
    plan = RunPlan(placement=placement, view=view, resources_fit=fits, resource_lines=lines)
    gpu_bytes, source = gpu_capacity(config, view, cluster)
    try:
        dims = load_model_dims(config)
        plan.memory = plan_memory(config, dims, placement, gpu_bytes, host, source, lengths=lengths)
    except PlanInputError as exc:
        plan.memory_problem = plan.time_problem = str(exc)
        return plan
    try:
        described = cluster_of(config, cluster)
        kinds, host_rates = DEVICE_KINDS, HOST
        if config.plan.constants_file:  # a node's measured constants; the config's own overrides win
            node = read_constants_file(config.plan.constants_file)
            applied = constants_for(config, node, dims, described.kind if described.gpus else "cpu", kinds, host_rates,
                                    installed)
            kinds, host_rates = applied.kinds, applied.host
            plan.constants_lines = applied.lines(node)
        kinds, host_rates = with_overrides(kinds, host_rates, config.plan.constants)
    except (ClusterError, ConstantsError, ConstantsFileError) as exc:
        plan.time_problem, plan.time_input_error = str(exc), True
        return plan
    layout = config_layout(config)
    if layout.gpus > described.gpus or layout.engine_wider_than(described.gpus_per_node):
        engine = f" ({layout.tp} on one node for each engine)" if layout.tp > 1 else ""
        plan.time_problem = (f"layout {layout.name} needs {layout.gpus} GPUs{engine}; the described cluster {described} "
                             f"has {described.gpus} ({described.gpus_per_node} per node): "
                             "lower resources.inference_gpus / resources.learner_gpus / resources.tensor_parallel_size "
                             "or describe a larger cluster (--cluster, plan.nodes, plan.gpus_per_node)")
    capacity = described_gpu_bytes(config, kinds.get(described.kind))
    checkpointing = plan.memory.activation_checkpointing

    def unfit(candidate: Layout, data_parallel: bool) -> str | None:
        resized = config.model_copy(update={
            "resources": config.resources.model_copy(update={"inference_gpus": candidate.inference,
                                                             "learner_gpus": candidate.learners,
                                                             "colocated": candidate.colocated}),
            "rl": config.rl.model_copy(update={"data_parallel": data_parallel})})
        memory = plan_memory(resized, dims, plan_placement(resized), capacity, host, "the described GPUs", checkpointing,
                             lengths)
        return None if memory.fits else memory.verdict()

    plan.time = choose_layout(config, dims, described, lengths or lengths_from_config(config), unfit, kinds, host_rates,
                              checkpointing)
    return plan
