"""The sandbox defences a config may require (``verifier.require``): names only, no pydantic, so the
verifier (``verifier.defences``, which reports and explains them) and the schema share one list."""

from __future__ import annotations

DEFAULT_REQUIRE: tuple[str, ...] = ("host_files_invisible", "no_network", "seccomp", "resource_limits")
REQUIRABLE: tuple[str, ...] = (
    "audit_hook", "chroot", "empty_environment", "empty_root", "fork_server_warm_imports", "fork_zygote",
    "fresh_empty_directory", "host_files_invisible", "ipc_and_keyrings_confined", "ipc_namespace", "killed_with_fork_server", "landlock",
    "module_allow_list", "mount_namespace", "network_namespace", "new_session", "no_network", "no_new_privs",
    "pid_namespace", "privileges_dropped", "process_per_execution", "python_guards", "resource_limits",
    "running_as_root", "seccomp", "signals_confined", "user_namespace", "wall_clock_kill_process_group",
)
"""The boolean keys of ``Verifier.defences()`` (a test keeps them equal): the names ``verifier.require`` may
use, checked when the config loads, before any actor starts."""
