"""Starting or attaching to Ray, and creating the named actors of a placement plan.

Every actor lives in namespace ``populora`` under the name the plan gives it, so the dashboard and
``ray list actors`` show them by role. A local cluster started here binds loopback only.

Output: by default the actors' stdout and stderr go to ``RUN_DIR/logs/<actor>.log``
(``reporting.run_dir.route_output``, told the directory by ``POPULORA_LOG_DIR`` in the job's runtime
environment), Ray forwards nothing to the driver's terminal (``log_to_driver=False``; forwarding is
asynchronous, so forwarded lines could land after the run's summary) and the actors' progress bars are
off. ``forward_output`` (``launch.py --verbose``) keeps Ray's forwarding instead.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

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

AUTH_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"
"""Ray's logger that announces token authentication at ``ray.init``; our dashboard lines say it instead."""


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
                    env: dict[str, str] | None = None) -> tuple[str, ...]:
    """How to open the dashboard at ``url`` (``ray.init``'s ``dashboard_url``; None or empty: not running) and log
    in. ``token_auth``: the cluster enforces Ray's token authentication (its page then asks for the token that
    ``ray get-auth-token`` prints). ``remote``: a cluster this process attached to (RAY_ADDRESS, ``ray job
    submit``), whose dashboard is on its head node. ``missing``: why the dashboard cannot run here (ray
    without its dashboard extra). The lines never hold the token itself."""
    env = dict(os.environ) if env is None else env
    if not url:
        why = (f"ray is installed without its dashboard extra ({missing}); pip install 'ray[default]' adds it"
               if missing else "the cluster runs no dashboard")
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


def connect(num_cpus_needed: float, log_dir: Path | None = None, forward_output: bool | None = None) -> Connection:
    """Attach to ``RAY_ADDRESS`` (set by ``ray job submit``) or start a local loopback-only cluster.

    ``log_dir``: the actors write their output to ``log_dir/<actor>.log`` and Ray forwards none of it to this
    terminal; None keeps Ray's forwarding (``forward_output`` overrides either way). Returns what it connected
    to and how to open the dashboard.
    """
    if ray.is_initialized():
        return Connection("the Ray session already running in this process", ())
    forward = log_dir is None if forward_output is None else forward_output
    env = {} if forward else actor_env(log_dir)
    runtime_env = {"env_vars": env} if env else None
    if not forward:  # our dashboard lines replace Ray's announcement of token authentication
        logging.getLogger(AUTH_SETUP_LOGGER).setLevel(logging.ERROR)
    address = os.environ.get("RAY_ADDRESS")
    if address:
        context = ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=forward,
                           runtime_env=runtime_env)
        return Connection(f"Ray cluster at {address}",
                          dashboard_lines(context.dashboard_url, token_auth_enabled(), remote=True))
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every listener on 127.0.0.1
    cpus = max(float(os.cpu_count() or 1), num_cpus_needed)
    missing = dashboard_missing()
    context = ray.init(
        namespace=NAMESPACE,
        num_cpus=int(cpus + 0.999),
        include_dashboard=missing is None,  # True without its dependencies would stop ray.init
        dashboard_host="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=forward,
        runtime_env=runtime_env,
    )
    url = context.dashboard_url if missing is None else None
    return Connection(f"a local Ray cluster ({cpus:g} CPUs)",
                      dashboard_lines(url, token_auth_enabled(), remote=False, missing=missing))


def verifier_nodes(resource: str) -> int:
    """Alive nodes that carry the verifier resource."""
    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get(resource, 0) > 0)


def actor_options(plan: PlacementPlan, actor: ActorPlan, learner_groups: dict[int, Any]) -> dict[str, Any]:
    """``.options(...)`` for one planned actor: its name, resources and restart policy (Ray restarts only verifiers).

    Verifiers request the custom resource only when some node carries it (else the head's CPUs).
    Actors that share a GPU (a learner pair; colocated, its engine replica too) are put in one placement-group
    bundle so they land on the same GPU.
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
        group = learner_groups.get(actor.gpu_ids[0])
        if group is None:
            group = placement_group([plan.gpu_bundle(actor.gpu_ids[0])], strategy="STRICT_PACK")
            ray.get(group.ready())
            learner_groups[actor.gpu_ids[0]] = group
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0)
    return options
