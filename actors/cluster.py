"""Starting or attaching to Ray, and creating the named actors of a placement plan.

Every actor lives in namespace ``populora`` under the name the plan gives it, so the dashboard and
``ray list actors`` show them by role. A local cluster started here binds loopback only.

Output: by default the actors' stdout and stderr go to ``RUN_DIR/logs/<actor>.log``
(``reporting.run_dir.route_output``, told the directory by ``POPULORA_LOG_DIR`` in the job's runtime
environment), Ray forwards nothing to the driver's terminal (``log_to_driver=False``; forwarding is
asynchronous, so forwarded lines could land after the run's summary) and the actors' progress bars are
off. ``forward_output`` (``launch.py --verbose``) keeps Ray's forwarding instead.

Several nodes: the actors may land on any node (an engine replica's tensor-parallel GPUs and a learner
GPU's teacher/student pair each on one node); :func:`check_shared_paths` proves before step 1 that every
node sees the run directory and the model directory. :func:`actor_device` is the one place an actor
decides between CUDA and the CPU, and the test/laptop-only stand-in mode (``POPULORA_GPU_STANDIN=1``)
makes actors given a logical GPU run their CPU path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from actors.cluster_wait import ClusterWait
from planning.placement import ActorPlan, PlacementPlan
from reporting.run_dir import LOG_DIR_ENV, route_output

NAMESPACE = "populora"
log = logging.getLogger(__name__)

QUIET_ACTOR_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bar (transformers.utils.logging.tqdm)
    "TQDM_DISABLE": "1",  # any other tqdm bar (tqdm reads TQDM_* variables as defaults)
    "TRANSFORMERS_VERBOSITY": "error",
}
"""Environment of the actors when their output goes to log files: no progress bars, transformers' errors only."""

NO_IDLE_WORKERS = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
"""Ray's system settings for a cluster that runs our actors, not tasks. By default a raylet starts one idle Python
worker per CPU, at its start and again for the first driver, ready for tasks; a run places actors, each of which
starts a worker of its own, and one cleanup task per node when it stops, so those would only sit idle (each ~1.3
CPU-s to start, 81 MiB resident of which 43 MiB its own; on a 96-CPU node, 96 of them). Measured on two cores, a
2-step short run: 56-59 CPU-s with them off, 61-62 with them on. The same settings as environment variables
(``RAY_enable_worker_prestart=0``) for clusters ``ray start`` runs: cluster.yaml."""

NO_IDLE_WORKERS_ENV = {f"RAY_{key}": str(int(value)) for key, value in NO_IDLE_WORKERS.items()}
"""``NO_IDLE_WORKERS`` as the environment a raylet reads them from (``ray start``, clusters started elsewhere)."""

AUTH_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
"""Ray's logger that announces token authentication at ``ray.init``; our dashboard lines say it instead."""

GPU_STANDIN_ENV = "POPULORA_GPU_STANDIN"
"""Tests and laptops only: set to 1 where Ray's nodes are started (``cluster_utils``, ``ray start``, the shell of a
local run), it makes actors given a logical GPU (``--num-gpus`` on a machine without one) run their CPU path, so
the GPU placement is exercised on CPUs. Never set it on a GPU cluster: the GPUs would sit idle."""

PATH_CHECK_FILE = ".populora-node-check"
"""The file the path check writes into the run directory for the nodes to read back (removed after the check)."""


@dataclass(frozen=True)
class Connection:
    """What ``connect`` attached to, and how to open that cluster's dashboard (never a secret)."""

    description: str
    dashboard: tuple[str, ...]

    def __str__(self) -> str:
        return self.description


def token_source(env: dict[str, str]) -> str:
    """Where Ray reads the authentication token, in its order of precedence (RAY_AUTH_TOKEN, then the file
    RAY_AUTH_TOKEN_PATH names, then ``~/.ray/auth_token``); names the place, never the token."""
    if env.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN variable of this shell"
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return f"the file {env['RAY_AUTH_TOKEN_PATH']} (RAY_AUTH_TOKEN_PATH)"
    return "~/.ray/auth_token"


def dashboard_lines(url: str | None, token_auth: bool, remote: bool, missing: str | None = None,
                    env: dict[str, str] | None = None, off: bool = False) -> tuple[str, ...]:
    """How to open the dashboard at ``url`` (``ray.init``'s ``dashboard_url``; None or empty: not running) and log
    in. ``token_auth``: the cluster enforces Ray's token authentication (its page then asks for the token that
    ``ray get-auth-token`` prints). ``remote``: a cluster this process attached to (RAY_ADDRESS, ``ray job
    submit``), whose dashboard is on its head node. ``missing``: why the dashboard cannot run here (ray
    without its dashboard extra). ``off``: the config turned it off (``run.dashboard``). The lines never hold the
    token itself."""
    env = dict(os.environ) if env is None else env
    if not url:
        if off:
            why = "run.dashboard=false"
        elif missing:
            why = f"ray is installed without its dashboard extra ({missing}); pip install 'ray[default]' adds it"
        else:
            why = "the cluster runs no dashboard"
        return (f"dashboard: not running: {why}. Progress is in this terminal, RUN_DIR/metrics.jsonl and "
                "TensorBoard (RUN_DIR/tensorboard).",)
    url = url if urlparse(url).scheme else f"http://{url}"
    port = urlparse(url).port or 8265
    if remote:
        login = ("log in with the token that `ray get-auth-token` prints on the head node" if token_auth
                 else "no login unless the cluster was started with RAY_AUTH_MODE=token (then `ray get-auth-token` "
                      "on the head node prints the token)")
        return (f"dashboard: on the cluster's head node, {url} as the cluster records it; from your machine: "
                f"ssh -L {port}:localhost:{port} <head node>, then open http://localhost:{port}",
                f"dashboard login: {login}")
    if not token_auth:
        return (f"dashboard: {url} (bound to this machine; from another one: ssh -L {port}:localhost:{port} <this host>)",
                "dashboard login: none (RAY_AUTH_MODE=disabled: anyone who can reach the port can use the cluster)")
    return (f"dashboard: {url} (bound to this machine; from another one: ssh -L {port}:localhost:{port} <this host>)",
            f"dashboard login: the page asks for a token: run `ray get-auth-token` in another terminal and paste what "
            f"it prints (Ray keeps it in {token_source(env)})")


def token_auth_enabled() -> bool:
    """Whether this process's Ray session enforces token authentication (RAY_AUTH_MODE=token, which ``ray.init``
    of a new local cluster turns on by default in Ray 2.60)."""
    try:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
    except ImportError:  # a Ray without token authentication
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    return bool(is_token_auth_enabled())


def dashboard_missing() -> str | None:
    """Why this Ray installation cannot run the dashboard (its optional dependencies absent), else None."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what ray.init checks before it starts the dashboard)
    except ImportError as exc:
        return str(exc)
    return None


def actor_env(log_dir: Path | None) -> dict[str, str]:
    """Environment variables the job gives every actor: where their output goes, and no progress bars.

    Variables the job already sets (``ray job submit --runtime-env-json``, the shell) are left as they are:
    Ray refuses to merge a job's runtime environment with one that sets the same variable."""
    if log_dir is None:
        return {}
    wanted = {LOG_DIR_ENV: str(Path(log_dir).resolve()), **QUIET_ACTOR_ENV}
    return {key: value for key, value in wanted.items() if key not in os.environ}


def route_actor_output(role: str) -> Path | None:
    """``route_output`` under this actor's name in the plan (``<role>-<pid>`` for an unnamed one); called first in
    every actor's ``__init__``, so what imports print and the child processes it starts land in its log file."""
    return route_output(ray.get_runtime_context().get_actor_name() or f"{role}-{os.getpid()}")


RAY_START = "ray start"
"""``cluster_address``'s ``how`` for the cluster that ``ray start`` runs on this machine."""

LOCAL_ASKED = "RAY_ADDRESS=local"
"""``cluster_address``'s ``how`` where the user asked for a separate local cluster."""


class ClusterConnectError(RuntimeError):
    """The cluster a run is to use cannot be attached to; the message names it and the ways out."""


def cluster_address(env: dict[str, str] | None = None) -> tuple[str | None, str]:
    """Which Ray cluster a run uses, and how that was decided: ``(address, how)``; address None: start a local one.
    ``connect`` and ``launch.py``'s plan (the dry run, the pre-flight resource check) both ask here.

    ``RAY_ADDRESS`` set (``ray job submit`` sets it): that cluster (``how`` ``"RAY_ADDRESS"``);
    ``RAY_ADDRESS=local``: a separate local cluster even where one runs (``LOCAL_ASKED``). Else a cluster that
    ``ray start`` runs on this machine (recorded in ``$TMPDIR/ray/ray_current_cluster`` and its GCS alive here),
    which a bare ``ray.init()`` would join (``RAY_START``). Else a local one (``how`` ``""``; a stale record is
    ignored)."""
    env = dict(os.environ) if env is None else env
    address = env.get("RAY_ADDRESS", "").strip()
    if address.lower() == "local":
        return None, LOCAL_ASKED
    if address:
        return address, "RAY_ADDRESS"
    from ray._private import services

    recorded = services.find_bootstrap_address(None)
    services.find_gcs_addresses.cache_clear()  # the GCS processes running now, not at an earlier call
    if recorded and recorded in services.find_gcs_addresses():
        return recorded, RAY_START
    return None, ""


def attached_description(address: str, how: str) -> str:
    """How the run and the plan name the cluster ``cluster_address`` chose to attach to (it starts with "Ray
    cluster": ``RunPlan.missing_resources`` then counts its CPUs)."""
    if how == RAY_START:
        return (f"Ray cluster at {address}, already running on this machine (started by `ray start`; "
                f"{LOCAL_ASKED} starts a separate one)")
    return f"Ray cluster at {address}"


def join_like_ray_init() -> None:
    """Token authentication for this driver as a bare ``ray.init()`` sets it up to join the cluster ``ray start``
    recorded: on when RAY_AUTH_MODE is unset and a token exists (``~/.ray/auth_token``, RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH), the very condition under which ``ray start --head`` turned it on for the cluster. An
    explicit address would skip this (Ray 2.60), and the cluster would refuse the driver."""
    try:
        from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def dial_problem(address: str, timeout_s: float = 5.0) -> str | None:
    """Why the GCS at ``address`` (``host:port``) does not take a connection from this process; None when it does
    or when ``address`` is no ``host:port`` (``auto``, ``ray://...``). Asked before ``ray.init``, which retries an
    address where nothing answers for minutes. Ray dials a loopback address at this machine's IP unless
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, so a cluster bound to loopback only is named as such."""
    from ray._private import services

    if "://" in address or ":" not in address:
        return None
    try:
        dialled = services.canonicalize_bootstrap_address(address)
        host, port = dialled.rsplit(":", 1)
        port_number = int(port)
    except ValueError:  # not an address Ray parses: ray.init says why
        return None
    try:
        with socket.create_connection((host.strip("[]"), port_number), timeout=timeout_s):
            return None
    except OSError as exc:
        why = f"nothing answers at {dialled}: {exc.strerror or exc}"
    if dialled != address:
        why += (f"; it binds loopback only, and Ray dials {dialled} unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 "
                "is set for launch.py too")
    return why


def cannot_attach(address: str, how: str, why: str) -> str:
    """The error of a cluster that cannot be attached to: which, why, and the ways out."""
    if how == RAY_START:
        return (f"cannot attach to the Ray cluster that `ray start` runs on this machine at {address}: {why}. "
                f"Stop it with `ray stop`, or run beside it on a separate local cluster: "
                f"{LOCAL_ASKED} python launch.py ...")
    return (f"cannot attach to the Ray cluster at {address} that RAY_ADDRESS names: {why}. Check the address, or "
            f"unset RAY_ADDRESS (or set {LOCAL_ASKED}) to run on a local cluster")


def attach(address: str, how: str, **init_kwargs: Any) -> Any:
    """``ray.init`` on the cluster ``cluster_address`` chose (``how``), returning its context; raises
    ``ClusterConnectError`` (``cannot_attach``) instead of Ray's own errors. The cluster ``ray start`` runs here is
    joined as a bare ``ray.init()`` joins it (``join_like_ray_init``); a ``host:port`` first gets a quick check that
    it answers (``dial_problem``)."""
    if how == RAY_START:
        join_like_ray_init()
    problem = dial_problem(address)
    if problem:
        raise ClusterConnectError(cannot_attach(address, how, problem))
    try:
        return ray.init(address=address, **init_kwargs)
    except Exception as exc:  # noqa: BLE001  (ConnectionError, a refused token, ...: one line instead of a traceback)
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if not token_auth_enabled():
            why += ("; if the cluster uses token authentication, set RAY_AUTH_MODE=token with its token in "
                    "~/.ray/auth_token (`ray get-auth-token` on its head prints it)")
        raise ClusterConnectError(cannot_attach(address, how, why)) from exc


def connect(num_cpus_needed: float, log_dir: Path | None = None, forward_output: bool | None = None,
            dashboard: bool = True) -> Connection:
    """Attach to the cluster ``cluster_address`` names (``RAY_ADDRESS``, as ``ray job submit`` sets it, else the
    one ``ray start`` runs on this machine), or start a local loopback-only cluster (always with ``RAY_ADDRESS=local``).
    Raises ``ClusterConnectError`` where the cluster to attach to cannot be reached.

    ``log_dir``: the actors write their output to ``log_dir/<actor>.log`` and Ray forwards none of it to this
    terminal; None keeps Ray's forwarding (``forward_output`` overrides either way). ``dashboard``: whether a
    local cluster starts Ray's dashboard (``run.dashboard``). Returns what it connected to and how to open the
    dashboard.
    """
    if ray.is_initialized():
        return Connection("the Ray session already running in this process", ())
    forward = log_dir is None if forward_output is None else forward_output
    env = {} if forward else actor_env(log_dir)
    runtime_env = {"env_vars": env} if env else None
    if not forward:  # our dashboard lines replace Ray's announcement of token authentication
        logging.getLogger(AUTH_SETUP_LOGGER).setLevel(logging.ERROR)
    address, how = cluster_address()
    if address:
        context = attach(address, how, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=forward,
                         runtime_env=runtime_env)
        return Connection(attached_description(address, how),
                          dashboard_lines(context.dashboard_url, token_auth_enabled(), remote=True))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every listener on 127.0.0.1
    cpus = max(float(os.cpu_count() or 1), num_cpus_needed)
    missing = dashboard_missing()
    context = ray.init(
        address="local",  # a new cluster, whatever RAY_ADDRESS or a stale record of `ray start` say
        namespace=NAMESPACE,
        num_cpus=int(cpus + 0.999),
        include_dashboard=dashboard and missing is None,  # True without its dependencies would stop ray.init
        dashboard_host="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=forward,
        runtime_env=runtime_env,
        _system_config=NO_IDLE_WORKERS,
    )
    url = context.dashboard_url if dashboard and missing is None else None
    return Connection(f"a local Ray cluster ({cpus:g} CPUs{'; ' + how if how else ''})",
                      dashboard_lines(url, token_auth_enabled(), remote=False, missing=missing, off=not dashboard))


def gpu_standin() -> bool:
    """Whether this process runs in the CPU stand-in mode (``GPU_STANDIN_ENV``)."""
    return os.environ.get(GPU_STANDIN_ENV, "").strip() not in ("", "0")


def actor_device() -> str:
    """``"cuda"`` when Ray gave this actor a GPU, else ``"cpu"``; ``"cpu"`` in the stand-in mode, whatever Ray gave."""
    return "cuda" if ray.get_gpu_ids() and not gpu_standin() else "cpu"


DETERMINISTIC_ENV = "POPULORA_DETERMINISTIC"
"""Set to 1 where Ray's nodes start (``gpu_check/system.py`` does, with ``CUBLAS_WORKSPACE_CONFIG=:4096:8``): the
learner and engine actors call ``torch.use_deterministic_algorithms(True, warn_only=True)``, so two runs that should
end equal do so on a GPU too; an op with no deterministic kernel warns in the actor's log instead of failing."""


def deterministic_torch(on_cuda: bool) -> bool:
    """Apply ``DETERMINISTIC_ENV`` in this process (called in the learner and engine actors); whether it is on.
    ``on_cuda`` (the actor computes on CUDA): attention (``scaled_dot_product_attention``) is also held to its math
    kernel, as the fused CUDA kernels' backward passes accumulate with atomics (torch only warns about it), the math
    one is matmuls and a softmax. On the CPU the kernels stay as they are (the switch is process-wide and would move
    the CPU's own flash kernel to the math one too)."""
    if os.environ.get(DETERMINISTIC_ENV, "").strip() in ("", "0"):
        return False
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    for fused in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp") if on_cuda else ():
        if hasattr(torch.backends.cuda, fused):
            getattr(torch.backends.cuda, fused)(False)
    return True


class SharedPathError(RuntimeError):
    """Some node of the cluster cannot see the run directory or the model directory."""


def model_config_digest(model_dir: str | Path) -> str:
    """SHA-256 of the model directory's ``config.json`` (raises ``OSError`` where it cannot be read)."""
    return hashlib.sha256((Path(model_dir) / "config.json").read_bytes()).hexdigest()


def path_problems(run_dir: str, token: str, model_dir: str, config_digest: str) -> list[str]:
    """What this machine cannot see of the run: the run directory (the driver's token read back from
    ``PATH_CHECK_FILE``, proving it is the very directory the driver made, and a file written and removed
    there) and the model directory (its ``config.json``, the same bytes as the driver's: SHA-256
    ``config_digest``). Empty when it sees both."""
    problems = []
    root = Path(run_dir)
    try:
        seen = (root / PATH_CHECK_FILE).read_text().strip()
    except OSError:
        seen = None
    if seen != token:
        problems.append(f"cannot see the run directory {run_dir} (run.run_dir): "
                        + ("it does not exist here" if not root.is_dir() else
                           f"it exists here but is another directory ({PATH_CHECK_FILE} written by the driver is "
                           f"{'missing' if seen is None else 'different'})"))
    else:
        probe = root / f"{PATH_CHECK_FILE}-{secrets.token_hex(4)}"
        try:
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            problems.append(f"cannot write in the run directory {run_dir} (run.run_dir): {exc.strerror or exc}")
    try:
        digest = model_config_digest(model_dir)
    except OSError:
        problems.append(f"cannot see the model directory {model_dir} (model.path): no readable config.json there")
    else:
        if digest != config_digest:
            problems.append(f"holds another model at {model_dir} (model.path): its config.json differs from the driver's")
    return problems


path_problems_on_node = ray.remote(num_cpus=0)(path_problems)


def check_shared_paths(run_dir: Path, model_dir: str, timeout_s: float = 120.0) -> list[str]:
    """Raise ``SharedPathError`` unless every alive node sees the run directory and the model directory
    (``path_problems``, run by one task pinned to each node); the error names each node (IP and id) and the
    path. Nothing of the run is touched but a token file, removed again. Skipped when the only node is the
    driver's own. Returns the ids of the nodes checked; a node that does not answer within ``timeout_s`` is
    logged and left out."""
    here = ray.get_runtime_context().get_node_id()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if [n["NodeID"] for n in nodes] == [here]:
        return []
    marker = Path(run_dir) / PATH_CHECK_FILE
    token = secrets.token_hex(16)
    marker.write_text(token)
    try:
        digest = model_config_digest(model_dir)
        calls = {path_problems_on_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                 .remote(str(Path(run_dir).resolve()), token, str(Path(model_dir).resolve()), digest): n for n in nodes}
        ready, late = ray.wait(list(calls), num_returns=len(calls), timeout=timeout_s)
    finally:
        marker.unlink(missing_ok=True)
    for ref in late:
        log.warning("node %s did not answer the path check within %.0f s", calls[ref]["NodeManagerAddress"], timeout_s)
    lines, checked = [], []
    for ref in ready:
        node = calls[ref]
        try:
            problems = ray.get(ref)
        except Exception as exc:  # the node went away while it checked: the scheduler will not use it either
            log.warning("node %s could not run the path check: %s", node["NodeManagerAddress"], exc)
            continue
        checked.append(node["NodeID"])
        lines += [f"  node {node['NodeManagerAddress']} (id {node['NodeID'][:12]}): {problem}" for problem in problems]
    if lines:
        raise SharedPathError(
            "not every node of the cluster sees the run's files:\n" + "\n".join(lines) + "\nEvery node must mount "
            "the run directory and the model directory at the same path (NFS, a cloud file store), or copy the "
            "model to the same path on each node. No actor was started; the run's metrics and checkpoints are as "
            "they were.")
    return checked


def verifier_nodes(resource: str) -> int:
    """Alive nodes that carry the verifier resource."""
    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) > 0)


def learner_group(plan: PlacementPlan, gpu: int, learner_groups: dict[int, Any], wait: ClusterWait | None = None) -> Any:
    """The placement group of the plan's shared GPU ``gpu`` (``PlacementPlan.gpu_bundle``: one GPU and the CPUs of
    the actors on it), so the learners sharing it (colocated: the engine too) land on one node and one GPU (made and
    waited for on first use, within ``wait``'s bound, kept in ``learner_groups``; one still pending when the bound
    passes is removed)."""
    group = learner_groups.get(gpu)
    if group is None:
        bundle = plan.gpu_bundle(gpu)
        group = placement_group([bundle], strategy="STRICT_PACK")
        (wait or ClusterWait(plan=plan)).placement_group(group, f"learner GPU {gpu}", bundle)
        learner_groups[gpu] = group
    return group


def reserve_gpus(plan: PlacementPlan, learner_groups: dict[int, Any], wait: ClusterWait | None = None) -> dict[str, str]:
    """Put every GPU actor of ``plan`` on a node before any of them starts; returns engine replica -> node id.

    The engine replicas go first, one after another, each a placement group of its ``tp`` GPUs (and CPUs) on
    one node, then each learner GPU (``learner_group``, kept in ``learner_groups``). Replicas of equal size
    placed in turn never block one another (a node holds ``floor(G_n / tp)`` of them whatever the others
    do) and learner GPUs of one GPU each then fit whatever GPUs are left, so this finds room whenever
    ``PlacementPlan.check`` passed; actors scheduled as they start could instead let a learner GPU split the
    node a replica needs. The replicas' groups are then removed and each replica is pinned to its node
    (``actor_options``), not run inside a group: vLLM in a placement group would take its tensor-parallel
    workers from it. Every wait is bounded by ``wait`` (``actors.cluster_wait``; default: its default bound).
    """
    wait = wait or ClusterWait(plan=plan)
    held = []
    try:
        for actor in plan.by_role("inference"):
            if actor.num_gpus and not plan.colocated:  # colocated engines are in their GPU's bundle
                bundle = {"GPU": actor.num_gpus, "CPU": actor.num_cpus}
                group = placement_group([bundle], strategy="STRICT_PACK")
                wait.placement_group(group, f"engine replica {actor.name}", bundle)
                held.append((actor.name, group))
        for gpu in sorted({a.gpu_ids[0] for a in plan.actors if a.role.startswith("learner") and a.gpu_ids}):
            learner_group(plan, gpu, learner_groups, wait)
        return {name: placement_group_table(group)["bundles_to_node_id"][0] for name, group in held}
    finally:
        for _, group in held:
            remove_placement_group(group)


def actor_options(plan: PlacementPlan, actor: ActorPlan, learner_groups: dict[int, Any],
                  pinned: dict[str, str] | None = None) -> dict[str, Any]:
    """``.options(...)`` for one planned actor: its name, resources and restart policy (Ray restarts only verifiers).

    Verifiers request the custom resource only when some node carries it (else the head's CPUs).
    Actors that share a GPU (a learner pair; colocated, its engine replica too) are put in one placement-group
    bundle so they land on the same GPU. An engine replica named in ``pinned`` (``reserve_gpus``) is held to that node.
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
    if plan.shares_gpu(actor):
        group = learner_group(plan, actor.gpu_ids[0], learner_groups)
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    if pinned and actor.name in pinned:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(pinned[actor.name], soft=False)
    return options
