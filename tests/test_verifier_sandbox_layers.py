"""Each layer of the sandbox alone, as root and as an ordinary user, and the programs that try to
rewrite the Python policy first and escape after.

Two postures: ``root`` (the fork server runs as root: chroot and per-run uids are available) and
``user`` (the server becomes uid 65534 once it has imported its modules, ``server_user``, so it
sets up namespaces, Landlock and seccomp exactly as an ordinary user would; as a non-root test
process, only this posture runs). Every attack really runs against real host objects of the test:
a canary file in a world-writable directory, a TCP listener, and a victim process of the same uid
as the sandbox. A control with every layer switched off shows each attack succeeding, so a test
that passes means the layer stopped it.

- ``test_layer_alone_through_the_verifier``: a whole Verifier with one layer on (the others and
  the process rlimits off) against reading and writing a host file, running a command and
  signalling the victim. (A program cannot import ``socket`` there: the module's file is out of
  reach in every layer, which is containment too, but not of the network.)
- ``test_layer_alone_in_a_process``: the same layer's kernel mechanism applied by our modules to
  a process forked from the test (which has ``socket`` and ``subprocess`` loaded), against all five
  attacks, including a TCP connection to the listener.
- ``test_policy_cannot_be_rewritten``: the route family (``dataclasses.sys.modules``, function
  globals, frames of tracebacks and generators, loaders, modules' ``__builtins__``,
  ``object.__subclasses__()``, gc, closure cells, unaudited functions), each followed by an escape.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 (loaded now: a confined process connects by address without reading a codec file)
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from verifier import Status, Verifier, landlock, namespaces, seccomp, syscalls
from verifier.defences import DEFAULT_REQUIRE, WeakSandboxError
from verifier.forkserver import OS_LAYERS
from tcp_listener import tcp_listener

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
POSTURES = ["root", "user"] if IS_ROOT else ["user"]
SERVER_USER = {"root": None, "user": NOBODY if IS_ROOT else None}
TIMEOUT_S = 3.0


def _userns_allowed() -> bool:
    """Whether an ordinary user may create the namespaces here (probed in a throwaway child)."""
    kernel = syscalls.load()
    pid = os.fork()
    if pid == 0:
        try:
            if IS_ROOT:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
            os._exit(0 if kernel.unshare(namespaces.CLONE_NEWUSER | namespaces.CLONE_NEWNET) == 0 else 1)
        finally:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


KERNEL = syscalls.load()
LANDLOCK_ABI = landlock.abi(KERNEL)
USERNS = _userns_allowed()


def available(layer: str) -> str:
    """'' when ``layer`` can run on this machine, else why not (the test skips with it)."""
    if layer == "namespaces" and not USERNS:
        return f"unprivileged user namespaces are not allowed here: {namespaces.HOW_TO_ENABLE}"
    if layer == "landlock" and LANDLOCK_ABI < 6:
        return f"Landlock ABI {LANDLOCK_ABI} < 6 (files need 1, TCP 4, signals 6)"
    if layer == "seccomp":
        try:
            seccomp.build()
        except (ImportError, OSError, ValueError) as exc:
            return f"no seccomp filter: {exc}"
    return ""


@pytest.fixture
def host(tmp_path_factory):
    """A canary file any uid may read and write, a directory any uid may create files in, a TCP
    listener and victims of a given uid; everything a contained program must not reach."""
    root = Path(tempfile.mkdtemp(prefix="verifier-canary-", dir="/tmp"))
    root.chmod(0o777)
    canary = root / "canary.txt"
    canary.write_text("precious")
    canary.chmod(0o666)
    victims: list[subprocess.Popen] = []

    def victim(uid: int | None) -> subprocess.Popen:
        extra = {"user": uid, "group": uid, "extra_groups": []} if uid is not None and IS_ROOT else {}
        proc = subprocess.Popen(["sleep", "60"], **extra)
        victims.append(proc)
        return proc

    with tcp_listener() as (port, received):
        yield {"dir": root, "canary": canary, "port": port, "received": received, "victim": victim}
    for proc in victims:
        proc.kill()
        proc.wait()
    shutil.rmtree(root, ignore_errors=True)


def sandbox_uid(posture: str) -> int | None:
    """The uid runs have when no layer changes it (the victim gets it, so only a layer can save it)."""
    return NOBODY if posture == "user" and IS_ROOT else (None if not IS_ROOT else 0)


# --- one layer at a time, through the Verifier -----------------------------------------------------

VERIFIER_ATTACKS = {
    "read": "def f(a):\n    return open({canary!r}).read()",
    "write": "def f(a):\n    open({new!r}, 'w').write('x')\n    open({canary!r}, 'a').write('pwned')\n    return 'wrote'",
    "command": "import os\ndef f(a):\n    return os.system('exit 7')",
    "signal": "import os\ndef f(a):\n    os.kill({victim}, 9)\n    return 'sent'",
}


def breached(attack: str, result, host: dict, victim: subprocess.Popen) -> bool:
    """Whether the attack's effect reached the host."""
    if attack == "read":
        return "precious" in (result.output or "")
    if attack == "write":
        return (host["dir"] / "new.txt").exists() or host["canary"].read_text() != "precious"
    if attack == "command":
        return result.output == str(7 << 8)
    time.sleep(0.05)
    return victim.poll() is not None


@pytest.mark.parametrize("posture", POSTURES)
@pytest.mark.parametrize("layer", ["python", "namespaces", "seccomp", "landlock", "none"])
def test_layer_alone_through_the_verifier(posture, layer, host):
    reason = available(layer) if layer not in ("python", "none") else ""
    if reason:
        pytest.skip(reason)
    disable = [name for name in OS_LAYERS if name != layer]
    with Verifier(timeout_s=TIMEOUT_S, workers=1, python_guards=layer == "python", disable=disable,
                  server_user=SERVER_USER[posture]) as v:
        d = v.defences()
        assert d["python_guards"] is (layer == "python") and not d["chroot"] and not d["privileges_dropped"]
        assert d["empty_root"] is (layer == "namespaces") and d["landlock"] is (layer == "landlock")
        assert d["seccomp"] is (layer == "seccomp") and d["resource_limits"] is False
        outcomes = {}
        for attack, template in VERIFIER_ATTACKS.items():
            victim = host["victim"](sandbox_uid(posture))
            program = template.format(canary=str(host["canary"]), new=str(host["dir"] / "new.txt"), victim=victim.pid)
            result = v.execute(program, "0", repeats=1)
            outcomes[attack] = (breached(attack, result, host, victim), result)
    if layer == "none":  # the control: every attack works when nothing stands in the way
        assert all(hit for hit, _ in outcomes.values()), outcomes
    else:
        assert not any(hit for hit, _ in outcomes.values()), outcomes
        if layer == "python":
            assert all(r.status is Status.FORBIDDEN for _, r in outcomes.values()), outcomes


# --- one layer at a time, the kernel mechanism in a forked process ---------------------------------


def _attack_all(canary: str, new: str, port: int, victim: int) -> dict[str, str]:
    """Run every attack in this process; the outcome of each as text ('ok ...' when it worked)."""
    out: dict[str, str] = {}

    def attempt(name, fn):
        try:
            out[name] = f"ok {fn()!r}"
        except BaseException as exc:  # noqa: BLE001 (whatever stopped it is the outcome)
            out[name] = f"stopped {type(exc).__name__}: {exc}"

    attempt("read", lambda: open(canary).read())
    attempt("write", lambda: open(new, "w").write("x"))
    attempt("socket", lambda: socket.create_connection(("127.0.0.1", port), timeout=2).sendall(b"leak"))
    attempt("command", lambda: subprocess.run(["/bin/sh", "-c", "exit 7"], timeout=5).returncode)
    attempt("signal", lambda: os.kill(victim, signal.SIGKILL))
    return out


def _confined_child(layer: str, posture: str, host: dict, victim: int) -> dict[str, str]:
    """Fork; the child becomes the posture's user, applies ``layer`` with our modules and attacks."""
    program = seccomp.build() if layer == "seccomp" else b""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(reader)
            if SERVER_USER[posture] is not None:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                KERNEL.prctl(syscalls.PR_SET_DUMPABLE, 1)
            assert KERNEL.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1) == 0
            if layer == "namespaces":
                info = namespaces.isolate(KERNEL, os.getuid() == 0, 300_000, keep_capabilities=False)
                assert info["isolated"], info
            elif layer == "landlock":
                assert landlock.restrict(KERNEL, landlock.ruleset(KERNEL, LANDLOCK_ABI)) == 0
            elif layer == "seccomp":
                assert KERNEL.bpf_loader(program, seccomp.placeholder_offsets(program)[0])(os.getpid()) == 0
            result = _attack_all(str(host["canary"]), str(host["dir"] / "new.txt"), host["port"], victim)
            os.write(writer, json.dumps(result).encode())
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001
            os.write(writer, json.dumps({"setup": repr(exc)}).encode())
            os._exit(1)
    os.close(writer)
    chunks = []
    while chunk := os.read(reader, 65536):
        chunks.append(chunk)
    os.close(reader)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


@pytest.mark.parametrize("posture", POSTURES)
@pytest.mark.parametrize("layer", ["namespaces", "seccomp", "landlock", "none"])
def test_layer_alone_in_a_process(posture, layer, host):
    reason = available(layer) if layer != "none" else ""
    if reason:
        pytest.skip(reason)
    victim = host["victim"](sandbox_uid(posture))
    outcome = _confined_child(layer, posture, host, victim.pid)
    assert "setup" not in outcome, outcome
    time.sleep(0.2)
    effects = {
        "read": outcome["read"] == "ok 'precious'",
        "write": (host["dir"] / "new.txt").exists(),
        "socket": bool(host["received"]),
        "command": outcome["command"] == "ok 7",
        "signal": victim.poll() is not None,
    }
    if layer == "none":
        assert all(effects.values()), (effects, outcome)
    else:
        assert not any(effects.values()), (effects, outcome)


# --- the policy cannot be rewritten: the route family, each followed by an escape -----------------

# Every program gets the real builtins through an allowed module (``B``), so the static check lets
# it through and the run itself must stop it; the escape at the end reads the canary.
HEAD = "import dataclasses, string\nB = dataclasses.sys.modules['builtins']\nget = B.getattr\ndef f(a):\n"
ESCAPE = "    return B.open({canary!r}).read()\n"
ROUTES = {
    # the reported program: rewrite the policy through a module an allowed module re-exports
    "sys_modules": HEAD + (
        "    mods = dataclasses.sys.modules\n"
        "    for name in [m for m in mods if 'verifier' in m]:\n"
        "        get(mods[name], '__dict__').update(ALLOWED_EVENTS=frozenset({{'open'}}), ALLOWED_MODULES=frozenset({{'os'}}))\n"
    ) + ESCAPE,
    # frames through sys._getframe (allowed: namedtuple needs it) and f_back/f_globals (not audited)
    "frame_globals": HEAD + (
        "    frame = dataclasses.sys._getframe(0)\n    while frame is not None:\n"
        "        g = get(frame, 'f_globals')\n        for key in ('guard', 'CONTEXT', 'PREPARED', 'ALLOWED_EVENTS'):\n"
        "            g[key] = None\n        frame = get(frame, 'f_back')\n"
    ) + ESCAPE,
    "function_globals": HEAD + (
        "    g = string.Formatter().get_field('0.__globals__', [dataclasses.dataclass], {{}})[0]\n"
        "    return g['sys'].modules['builtins'].open({canary!r}).read()\n"
    ),
    "traceback_frame": HEAD + (
        "    try:\n        1 / 0\n    except ZeroDivisionError:\n        tb = dataclasses.sys.exc_info()[2]\n"
        "    get(get(tb, 'tb_frame'), 'f_globals')['guard'] = None\n"
    ) + ESCAPE,
    "generator_frame": HEAD + (
        "    gen = (x for x in [1])\n    get(get(gen, 'gi_frame'), 'f_globals')['guard'] = None\n"
    ) + ESCAPE,
    "loader": HEAD + (
        "    spec = string.Formatter().get_field('0.__spec__', [dataclasses], {{}})[0]\n"
        "    return spec.loader.get_data({canary!r})\n"
    ),
    "module_builtins": HEAD + (
        "    b = string.Formatter().get_field('0.__builtins__', [dataclasses], {{}})[0]\n"
        "    return b['open']({canary!r}).read()\n"
    ),
    "subclasses": HEAD + (
        "    for cls in get(object, '__subclasses__')():\n        if cls.__name__ == 'Popen':\n"
        "            return cls(['cat', {canary!r}]).wait()\n"
        "    spawner = dataclasses.sys.modules.get('_posixsubprocess')\n"
        "    if spawner is not None:\n"
        "        return spawner.fork_exec(['/bin/cat'], [b'/bin/cat'], True, (), None, None, -1, -1, -1, -1, -1, -1,"
        " -1, -1, False, False, None, None, None, -1, None, False)\n"
    ) + ESCAPE,
    "gc": HEAD + "    gc = dataclasses.sys.modules['gc']\n    return len(gc.get_objects())\n",
    "closure_cells": HEAD + (
        "    guarded_import = get(f, '__builtins__')['__import__']\n"
        "    for cell in get(guarded_import, '__closure__') or ():\n"
        "        if isinstance(cell.cell_contents, frozenset):\n            cell.cell_contents = frozenset({{'ctypes', 'os'}})\n"
        "    guarded_import('ctypes')\n"
    ) + ESCAPE,
    "unaudited_signal": HEAD + (
        "    mods = dataclasses.sys.modules\n"
        "    fd = mods['os'].pidfd_open({victim})\n    mods['signal'].pidfd_send_signal(fd, 9)\n"
    ) + ESCAPE,
}
# the check that stops each route at run time (a static rejection would not test the route)
STOPPED_BY = {
    "sys_modules": "'open'", "frame_globals": "'open'", "function_globals": "'open'", "traceback_frame": "tb_frame",
    "generator_frame": "gi_frame", "loader": "'open'", "module_builtins": "'open'", "subclasses": "'open'",
    "gc": "gc.get_objects", "closure_cells": "'import'", "unaudited_signal": "pidfd_open",
}


@pytest.mark.parametrize("posture", POSTURES)
@pytest.mark.parametrize("layers", ["all", "python_only"])
def test_policy_cannot_be_rewritten(posture, layers, host):
    if layers == "all" and any(available(layer) for layer in ("namespaces", "seccomp", "landlock")):
        pytest.skip("; ".join(filter(None, (available(layer) for layer in ("namespaces", "seccomp", "landlock")))))
    disable = list(OS_LAYERS) if layers == "python_only" else []
    victims = {name: host["victim"](sandbox_uid(posture)) for name in ROUTES}
    with Verifier(timeout_s=TIMEOUT_S, workers=1, disable=disable, server_user=SERVER_USER[posture]) as v:
        items = [(program.format(canary=str(host["canary"]), victim=victims[name].pid), "0") for name, program in ROUTES.items()]
        results = dict(zip(ROUTES, v.execute_many(items, repeats=1)))
        assert v.execute("def f(a):\n    return a", "[1]", repeats=1).output == "[1]"
    time.sleep(0.1)
    for name, result in results.items():
        assert result.status is Status.FORBIDDEN and STOPPED_BY[name] in result.error, (name, result)
        assert "precious" not in (result.output or ""), (name, result)
        assert victims[name].poll() is None, name
    assert host["canary"].read_text() == "precious"


def test_require_refuses_a_weak_sandbox_and_the_opt_out_warns(capfd):
    with pytest.raises(WeakSandboxError) as refused:
        Verifier(workers=1, disable=["namespaces", "landlock", "credentials"], require=["host_files_invisible", "no_network", "seccomp"])
    message = str(refused.value)
    assert "host_files_invisible" in message and "no_network" in message and "sysctl" in message
    with pytest.raises(ValueError, match="unknown defence"):
        Verifier(workers=1, require=["host_files_invisble"])
    with pytest.warns(RuntimeWarning, match="allow_weak"):
        with Verifier(workers=1, disable=["namespaces", "landlock", "credentials"], require=["host_files_invisible"], allow_weak=True) as v:
            assert v.execute("def f(a):\n    return a", "1").output == "1"
    assert "Development only" in capfd.readouterr().err


def test_self_referencing_outputs_are_bad_output():
    with Verifier(timeout_s=TIMEOUT_S, workers=1) as v:
        cases = [
            "def f(a):\n    x = []\n    x.append(x)\n    return [x]",
            "def f(a):\n    d = {}\n    d['k'] = d\n    return d",
            "class Fake:\n    def __repr__(self):\n        return '5'\ndef f(a):\n    return Fake()",
            "class Mine(int):\n    def __repr__(self):\n        return '7'\ndef f(a):\n    return [Mine(3)]",
        ]
        for program in cases:
            assert v.execute(program, "0").status is Status.BAD_OUTPUT, program
        shared = v.execute("def f(a):\n    x = [1]\n    return [x, x, {'k': (x, None)}, -0.0, 1e300, 2j, b'b', {3}]", "0")
        assert shared.status is Status.OK and shared.output == "[[1], [1], {'k': ([1], None)}, -0.0, 1e+300, 2j, b'b', {3}]"


@pytest.mark.parametrize("posture", POSTURES)
def test_requirable_names_are_the_reports_boolean_keys(posture):
    from verifier.defences import REQUIRABLE

    with Verifier(workers=1, server_user=SERVER_USER[posture]) as v:
        report = v.defences()
    assert set(REQUIRABLE) == {k for k, x in report.items() if isinstance(x, bool)}


def test_config_default_requirements_match_the_verifier():
    from configs.schema import Config

    assert tuple(Config().verifier.require) == DEFAULT_REQUIRE and Config().verifier.allow_weak_sandbox is False


@pytest.mark.parametrize("posture", POSTURES)
def test_defences_command_reports_every_layer(posture):
    extra = ["--as-user", str(NOBODY)] if SERVER_USER[posture] is not None else []
    out = subprocess.run([sys.executable, "-m", "verifier", "defences", *extra], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    report = json.loads(out.stdout)
    for key in ("python_guards", "audit_hook", "user_namespace", "empty_root", "network_namespace", "pid_namespace",
                "landlock", "landlock_abi", "seccomp", "chroot", "privileges_dropped", "resource_limits", "missing"):
        assert key in report, key
    assert report["running_as_root"] is (posture == "root")
    assert out.returncode == (1 if report["missing"] else 0)
    if not any(available(layer) for layer in ("namespaces", "seccomp", "landlock")):
        assert report["missing"] == [] and report["empty_root"] and report["seccomp"] and report["landlock"]
        assert report["chroot"] is report["privileges_dropped"] is (posture == "root")
