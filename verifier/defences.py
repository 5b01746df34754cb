"""The defences a run may require (``verifier.require``), and what to do where one is missing.

``Verifier.defences()`` reports every layer of the sandbox on this machine. A few of its keys
name outcomes rather than mechanisms, so that a requirement holds whichever layer provides it:

- ``host_files_invisible``: a run can neither read nor write a host file (an empty read-only
  root in a mount namespace, a chroot as root, or Landlock);
- ``no_network``: a run cannot reach any network service (a network namespace, or Landlock's
  TCP rules, ABI >= 4);
- ``seccomp``: the system-call filter is loaded in every run;
- ``resource_limits``: CPU, memory, file-size and process rlimits and the wall-clock kill.

Any other boolean key of the report (``pid_namespace``, ``landlock``, ``python_guards``,
``privileges_dropped``...) may be required as well. Pure Python, no Ray.
"""

from __future__ import annotations

from typing import Any, Iterable

from configs.defences import DEFAULT_REQUIRE, REQUIRABLE  # the names a config may require (no pydantic)
from verifier.namespaces import HOW_TO_ENABLE as NAMESPACES_HOW_TO

LANDLOCK_HOW_TO = "a kernel >= 5.13 with Landlock enabled (CONFIG_SECURITY_LANDLOCK=y and `landlock` in the `lsm=` boot parameter)"
HOW_TO_ENABLE: dict[str, str] = {
    "host_files_invisible": f"{NAMESPACES_HOW_TO}; or {LANDLOCK_HOW_TO}; or run the verifier as root (chroot)",
    "no_network": f"{NAMESPACES_HOW_TO}; or Landlock ABI >= 4 (Linux >= 6.7)",
    "seccomp": "install libseccomp (`apt-get install libseccomp2`) and the `pyseccomp` package (`pip install pyseccomp`, "
    "part of `bash install.sh`) on a kernel with CONFIG_SECCOMP_FILTER",
    "resource_limits": "Linux rlimits are always applied; this is missing only if a layer was switched off",
    "pid_namespace": NAMESPACES_HOW_TO,
    "user_namespace": NAMESPACES_HOW_TO,
    "empty_root": NAMESPACES_HOW_TO,
    "network_namespace": NAMESPACES_HOW_TO,
    "landlock": LANDLOCK_HOW_TO,
    "privileges_dropped": "run the verifier as root: each run then gets an unprivileged uid of its own",
    "chroot": "run the verifier as root",
}


class WeakSandboxError(RuntimeError):
    """The machine cannot provide a required defence; the message lists each and how to enable it."""


def missing(report: dict[str, Any], require: Iterable[str]) -> list[str]:
    """The required names that the ``Verifier.defences()`` report does not show as active.
    An unknown name is a ValueError (a typo must not pass silently)."""
    out = []
    for name in require:
        if name not in report or not isinstance(report[name], bool):
            known = sorted(k for k, v in report.items() if isinstance(v, bool))
            raise ValueError(f"verifier.require names an unknown defence {name!r}; known: {', '.join(known)}")
        if not report[name]:
            out.append(name)
    return out


def explain(names: list[str], report: dict[str, Any]) -> str:
    """A message naming each missing defence, why (where known) and how to enable it."""
    lines = [f"the verifier sandbox on this machine lacks {len(names)} required defence(s):"]
    for name in names:
        why = ""
        if name in ("host_files_invisible", "no_network", "pid_namespace", "user_namespace", "empty_root", "network_namespace"):
            why = f" (namespaces: {report.get('namespace_error') or 'not available'})"
        elif name == "seccomp" and report.get("seccomp_error"):
            why = f" ({report['seccomp_error']})"
        lines.append(f"- {name}{why}: {HOW_TO_ENABLE.get(name, 'see docs/verifier.md')}")
    lines.append("Set verifier.allow_weak_sandbox: true to run anyway (development only; warned on every start).")
    return "\n".join(lines)
