"""The fork server: a warm interpreter that forks one confined child per execution.

``verifier.sandbox.Verifier`` starts it as ``python -S -s -B -c BOOTSTRAP <root> serve <settings>``
with an environment holding only ``PYTHONHASHSEED=0``, so every execution, on every machine, hashes
strings the same way. The server

1. imports every allowed module once, binds the kernel calls it needs (``verifier.syscalls``) and
   sets ``PR_SET_NO_NEW_PRIVS``; with ``server_user`` (root only) it then becomes that user;
2. isolates itself (``verifier.namespaces``): new user, mount, network, PID, IPC and UTS
   namespaces and an empty read-only root; it goes on as pid 1 of the new PID namespace while its
   parent, the keeper, waits outside;
3. makes one Landlock ruleset (``verifier.landlock``) that denies everything;
4. forks a zygote (``_Zygote``) before it reads any request, from a fresh thread so that the
   zygote's stack holds none of the server's frames, then loops: read requests (JSON lines on
   stdin), have the zygote clone a child per request (the server's own child, through
   ``CLONE_PARENT``), send the child its request on a pipe made for that run (the zygote only
   passes the pipe on, so no request ever enters the process runs are cloned from), enforce the
   wall-clock deadline with ``killpg(SIGKILL)``, reap the child through a pidfd, read the child's
   one result frame from another pipe made for that run alone (``verifier.frames``), write one JSON
   result line per request on stdout, never blocking on it. It exits on EOF, when its caller dies,
   and, once its runs in flight have reported, when the zygote died (``Server.retire``: the
   server never clones or forks a run itself; the caller retries the rest on a fresh server).
   Where ``clone`` is unavailable (no system call number for this machine) there is no zygote and
   the caller refuses to start the verifier.

A child (``_child``) reads its request, draws 8 fresh bytes for its random number generators and
heap shift, and confines itself before it touches the program (``_confine_child``): new
session and process group, stdin/stdout/stderr closed, an empty environment, rlimits (CPU
seconds, address space, file size 0, no new processes, few descriptors, no core), as root a fresh
empty directory as chroot and an unprivileged uid of its own, the Landlock ruleset, every other
descriptor closed except its result pipe, a parent-death signal, and last the seccomp filter
(``verifier.seccomp``). Then it lets go of the privileged helpers (``_take_context``; the zygote
already dropped the verifier's modules, ``_forget_privileged_modules``), runs the
program with the Python-level guards of ``verifier.guard`` and writes one frame
(``verifier.frames``) to its result pipe. The pipe is new for every run and nothing else holds its
write end once the run has started, so whatever a run does to it (its size, flags, owner) ends
with the run. Each OS layer can be switched off (``layers``) to test that every other one holds alone.
"""

from __future__ import annotations

import _random
import _thread
import base64
import binascii
import errno
import fcntl
import functools
import gc
import json
import marshal
import math
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from typing import Any, Callable

from verifier import guard, landlock, namespaces, syscalls
from verifier.frames import HEADER_BYTES, decode as decode_frame, encode as encode_frame, frame_bound, violation
from verifier.outputs import value_problem
from verifier.seccomp import placeholder_offsets

# Bootstrap run by ``python -S -c``: import this module without running ``verifier/__init__``.
# ``-E``/``-I`` would also ignore PYTHONHASHSEED, so the host passes an environment holding nothing else.
INTERPRETER_FLAGS = ("-S", "-s", "-B")
BOOTSTRAP = (
    "import sys, types\n"
    "sys.path[:] = [p for p in sys.path if p]\n"
    "pkg = types.ModuleType('verifier'); pkg.__path__ = [sys.argv[1] + '/verifier']\n"
    "sys.modules['verifier'] = pkg\n"
    "import verifier.forkserver as server\n"
    "server.main(sys.argv[1:])\n"
)
# The operating-system layers a request-independent setting can switch off (all on by default).
OS_LAYERS = ("namespaces", "landlock", "seccomp", "credentials", "process_limits")
NOBODY = 65534
UIDS_PER_SERVER = 64
UID_BLOCKS = 4096
RESULT_FD = 3
CHILD_FDS = 8
BAD_EXIT = 70
CLONE_PARENT = 0x00008000
PR_SET_PDEATHSIG = syscalls.PR_SET_PDEATHSIG
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = syscalls.KEYCTL_JOIN_SESSION_KEYRING, syscalls.KEYCTL_CLEAR
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = syscalls.KEY_SPEC_USER_KEYRING, syscalls.KEY_SPEC_USER_SESSION_KEYRING
CLONE_NEWUSER, CLONE_NEWIPC = namespaces.CLONE_NEWUSER, namespaces.CLONE_NEWIPC
CALLER_CHECK_S = namespaces.CALLER_CHECK_S  # how often an idle server looks whether its caller is still alive


class Context:
    """What a child needs to confine itself, made once by the server; ``CONTEXT`` holds it until a
    child lets go of it (``_take_context``) right before the program runs."""

    def __init__(self) -> None:
        self.kernel: syscalls.Kernel | None = None
        self.deny: Callable[[str], Any] = guard.fatal(RESULT_FD)
        self.builtins: dict[str, Any] = {}
        self.devnull = -1
        self.host_root = False
        self.credentials = False
        self.process_limits = True
        self.landlock_fd = -1
        self.seccomp: Callable[[int], int] | None = None  # loads the filter for a pid (``Kernel.bpf_loader``)
        self.python_guards = True  # the verifier's setting: the zygote disarms the unaudited functions once
        self.restrict_landlock: Callable[[int], int] = lambda fd: -38
        self.install_hook: Callable[[Callable[[str], Any]], None] = guard.install_audit_hook
        self.disarm: Callable[[Callable[[str], Any]], None] = guard.disarm
        self.generators: list[_random.Random] = []  # every random number generator a run inherits (``_reseed``)
        self.seed: Callable[[Any, int], None] = _random.Random.seed
        self.drop_capabilities: Callable[[], bool] = lambda: False  # ``namespaces.drop_capabilities`` with the kernel


CONTEXT: Context | None = None


def _import_allowed_modules(allowed: frozenset[str]) -> None:
    for name in sorted(allowed):
        __import__(name)


def _address_space_in_use() -> int:
    """Current virtual memory size of this process in bytes (from /proc/self/statm)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _above_result_fd(fd: int) -> int:
    """``fd`` moved to a number above ``RESULT_FD`` (a child puts its result pipe there first)."""
    if fd > RESULT_FD:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, RESULT_FD + 1)
    os.close(fd)
    return moved


def _set_limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _confine_child(ctx: Context, workdir: str, uid: int, cpu_s: int, address_space: int, server: int) -> dict:
    """Everything the child does to itself before running untrusted code; returns what succeeded.
    A layer that is on but fails to apply ends the child (CRASHED), never a weaker run."""
    kernel = ctx.kernel
    report = {"chroot": False, "uid": os.getuid(), "parent_death_signal": False, "landlock": False, "seccomp": False,
              "own_ipc": False, "own_keyrings": False,
              "process_limits": ctx.process_limits}
    os.setsid()
    # closed, not /dev/null: a /dev/null shared with the zygote would be one open file description for
    # every run, whose flags one run could set for the next (the isolated root has no /dev/null to open)
    os.closerange(0, RESULT_FD)
    # the environment was emptied and the signal dispositions set once in the server (``main``)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    _set_limit(resource.RLIMIT_AS, address_space)
    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_NOFILE, CHILD_FDS)
    _set_limit(resource.RLIMIT_MEMLOCK, 0)
    _set_limit(resource.RLIMIT_MSGQUEUE, 0)
    if ctx.process_limits:
        _set_limit(resource.RLIMIT_FSIZE, 0)
        _set_limit(resource.RLIMIT_NPROC, 0)
    # without seccomp a run reaches SysV IPC, POSIX message queues and keyrings with raw system calls
    # (ctypes is reachable once the Python layer is disarmed): each gets its own (``_forget_other_runs``)
    weak = ctx.seccomp is None and kernel is not None
    if ctx.credentials:
        if weak:  # still root here, and not yet in the chroot, where a new user namespace is refused
            report["own_ipc"] = kernel.unshare(CLONE_NEWIPC) == 0
        os.chroot(workdir)
        os.chdir("/")
        report["chroot"] = True
        os.setgroups([])
        for candidate in (uid, NOBODY):
            try:
                os.setresgid(candidate, candidate, candidate)
                os.setresuid(candidate, candidate, candidate)
                break
            except OSError:
                continue
        report["uid"] = os.getuid()
        if os.getuid() == 0:
            raise PermissionError("could not drop root privileges")
    else:
        os.chdir(workdir)
    if weak:
        _forget_other_runs(ctx, report)
    if ctx.landlock_fd >= 0:
        if ctx.restrict_landlock(ctx.landlock_fd) != 0:
            raise PermissionError("could not apply the Landlock ruleset")
        report["landlock"] = True
    os.closerange(RESULT_FD + 1, 1 << 20)
    # armed after the change of credentials, which clears it
    if kernel is not None and kernel.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) == 0:
        report["parent_death_signal"] = True
        if os.getppid() != server:  # the server died before the signal was armed (even before we ran)
            os._exit(BAD_EXIT)
    if ctx.seccomp is not None:
        if ctx.seccomp(os.getpid()) != 0:
            raise PermissionError("could not load the seccomp filter")
        report["seccomp"] = True
    return report


def _forget_other_runs(ctx: Context, report: dict) -> None:
    """Where no seccomp filter stops the calls: no SysV IPC object, POSIX message queue or key of an
    earlier run of this uid reaches the program. Without root the run enters a user and an IPC
    namespace of its own (its keyrings and IPC objects die with it) and drops every capability it
    got there; as root (chrooted, where a new user namespace is refused) it got a fresh IPC namespace
    before the chroot, joins a new session keyring and clears its uid's user keyrings: a run that
    stripped the permission to clear them makes the next runs of that uid CRASHED, never readers."""
    kernel = ctx.kernel
    if not report.get("own_ipc") and kernel.unshare(CLONE_NEWUSER | CLONE_NEWIPC) == 0:
        report["own_ipc"] = report["own_keyrings"] = True
        if not ctx.drop_capabilities():
            raise PermissionError("could not drop the capabilities of the run's user namespace")
        return
    keyctl = kernel.numbers.get("keyctl")
    if keyctl is None:
        raise PermissionError("no keyctl system call number here to clear the keyrings")
    cleared = [kernel.syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, 0)] + [
        kernel.syscall(keyctl, KEYCTL_CLEAR, ring) for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING)]
    if any(result < 0 and result != -errno.ENOSYS for result in cleared):
        raise PermissionError(f"could not clear the keyrings an earlier run of this uid may have filled ({cleared})")
    report["own_keyrings"] = True


def _forget_privileged_modules() -> None:
    """Drop the verifier's modules from ``sys.modules`` and this module's references to the ones
    that hold kernel calls or the policy. Done once in the zygote (its children inherit it); what a
    child still needs travels in ``CONTEXT``."""
    global guard, landlock, namespaces, syscalls
    # and the socket module, loaded only for the zygote's command socket (its bound functions keep working)
    for name in [m for m in sys.modules if m == "verifier" or m.startswith("verifier.") or m in ("socket", "_socket")]:
        del sys.modules[name]
    guard = landlock = namespaces = syscalls = None  # type: ignore[assignment]


def _take_context() -> Context:
    """The context, no longer reachable through this module: a child calls this once it has
    confined itself, right before the program (its kernel calls go with the last reference)."""
    global CONTEXT
    ctx, CONTEXT = CONTEXT, None
    return ctx


class _Pad:
    """An instance the size of a small user object, for ``_perturb_allocator``."""


def _reseed(entropy: int) -> None:
    """Seed every random number generator the run can reach from ``entropy`` (8 fresh bytes of this
    run): ``random``'s module-level generator and any other ``random.Random`` made before the zygote
    was forked (``Context.generators``). A program that draws from one gets other numbers in each
    of its runs, so the determinism check calls it NONDETERMINISTIC on one worker or several;
    a run that seeds a generator itself is reproducible as before. The C-level ``seed`` touches
    only the generators' own state (a few pages), not ``random``'s Python code."""
    for generator in CONTEXT.generators:
        CONTEXT.seed(generator, entropy)


def _perturb_allocator(entropy: int) -> None:
    """Shift the heap by an amount that differs from run to run, so that a program whose value depends
    on object addresses (``hash(object())``, iterating a set of instances) gives different results in
    its two runs: cloned children otherwise share the zygote's heap layout.

    The amounts come from the run's fresh ``entropy`` (two runs get equal shifts with probability
    1 / (251 * 241), on one worker or several), not from drawing from ``random``: reseeding it in
    Python and drawing cost each child ~40 page faults, about 15% of an execution (measured).
    """
    _perturb_allocator.pad = [object() for _ in range(entropy % 251)] + [_Pad() for _ in range((entropy >> 8) % 241)]


def _run_program(code_b64: str, args_b64: str, max_output_chars: int, guards: bool, entropy: int) -> tuple[str, str | None, str]:
    """Load the compiled program and the literal arguments (prepared by ``verifier.preflight``), run
    ``f(*args, **kwargs)``; returns (status, output repr or None, error). A violation of the
    Python layer never returns here: ``deny`` writes FORBIDDEN and ends the process."""
    try:
        code = marshal.loads(binascii.a2b_base64(code_b64))
        positional, keywords = marshal.loads(binascii.a2b_base64(args_b64))
        if type(code) is not type(_run_program.__code__) or not isinstance(positional, list) or not isinstance(keywords, dict):
            raise TypeError("unexpected payload types")
    except Exception as exc:  # our own request, never a program's: the run ends without a frame (CRASHED)
        raise RuntimeError(f"undecodable request: {type(exc).__name__}") from None
    module = type(sys)("__main__")
    _reseed(entropy)
    ctx = _take_context()
    deny, install_hook = ctx.deny, ctx.install_hook
    if guards:
        module.__dict__["__builtins__"] = ctx.builtins
        if not ctx.python_guards:  # the zygote disarmed nothing for this verifier: do it here
            ctx.disarm(deny)
    del ctx
    sys.modules["__main__"] = module
    _perturb_allocator(entropy)
    if guards:
        install_hook(deny)
    del install_hook
    try:
        exec(code, module.__dict__)
        entry = module.__dict__.get("f")
        if not callable(entry):
            return "no_entry_function", None, "the program defines no callable f"
        value = entry(*positional, **keywords)
        output = repr(value)
        problem = value_problem(value)
    except MemoryError:
        return "memory_limit", None, "MemoryError: the program ran out of its memory limit"
    except BaseException as exc:  # SystemExit, KeyboardInterrupt and the like are program errors too
        return "runtime_error", None, f"{type(exc).__name__}: {exc}"[:300]
    if not isinstance(output, str):
        return "bad_output", None, "repr() did not return a string"
    if len(output) > max_output_chars:
        return "output_too_large", None, f"output repr has {len(output)} characters, the bound is {max_output_chars}"
    if problem:
        return "bad_output", None, problem
    return "ok", output, ""


def _read_request(fd: int) -> bytes:
    """Everything the server writes on the run's request pipe, up to its end of file."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _child(request_fd: int, result_fd: int, server: int) -> None:
    """Body of a child cloned by the zygote for ``server`` (its pid); never returns. The child, not
    the zygote, receives the request (``marshal``led ``(request, workdir, uid, address_space)`` on a
    pipe of its own): nothing of it is in the process the next run is cloned from."""
    try:
        os.dup2(result_fd, RESULT_FD)
        request, workdir, uid, address_space = marshal.loads(_read_request(request_fd))
        entropy = int.from_bytes(os.urandom(8), "little")
        cpu_s = int(math.ceil(request["timeout_s"])) + 1
        report = _confine_child(CONTEXT, workdir, uid, cpu_s, address_space, server)
        if request.get("probe"):
            data = encode_frame("probe", "", json.dumps(report))
        else:
            status, output, error = _run_program(
                request["code"], request["args"], request["max_output_chars"], request["guards"], entropy
            )
            data = encode_frame(status, error, output or "")
        view = memoryview(data)
        while view:
            view = view[os.write(RESULT_FD, view) :]
        os._exit(0)
    except BaseException:
        os._exit(BAD_EXIT)


def _zygote_main(kit: list) -> None:
    """The zygote's loop: receive one byte with two descriptors attached (``SCM_RIGHTS``): the
    write end of the run's result pipe and the read end of its request pipe; clone a child that
    reads its request from the latter and runs it; close both copies; answer the pid.

    The zygote never receives a request: no program, argument or output ever enters the memory
    every run is cloned from. ``kit`` (emptied at once) holds the command socket, the reply pipe,
    ``clone``, the server's pid and /dev/null; a cloned child deletes ``clone`` from this frame
    before it runs anything."""
    commands, replies, clone, server, devnull = kit
    kit.clear()
    kernel = CONTEXT.kernel if CONTEXT is not None else None
    if kernel is None or kernel.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0 or os.getppid() != server:
        return
    del kernel
    if CONTEXT.python_guards:  # once here rather than in every run (each would copy the modules' pages)
        CONTEXT.disarm(CONTEXT.deny)
    _forget_privileged_modules()
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    low = 3  # hold no descriptor of the server's (its stdin and stdout are the host's pipes)
    for fd in sorted({commands.fileno(), replies, devnull, CONTEXT.landlock_fd} - {-1}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    receive, space, order = commands.recvmsg, socket.CMSG_SPACE(8), sys.byteorder
    while True:
        data, ancillary, _, _ = receive(1, space)
        if len(data) != 1 or len(ancillary) != 1 or len(ancillary[0][2]) < 8:  # the server is gone or closed us
            return
        fds = ancillary[0][2]
        result_fd, request_fd = int.from_bytes(fds[:4], order), int.from_bytes(fds[4:8], order)
        pid = clone()
        if pid == 0:
            del clone
            _child(request_fd, result_fd, server)
        # before the answer: once the server has it, only the run holds the result pipe's write end
        os.close(result_fd)
        os.close(request_fd)
        os.write(replies, pid.to_bytes(8, "little", signed=True))


class _Zygote:
    """A process forked from the warm server that does nothing but clone children for it.

    A process that forks pays a copy-on-write fault for every page it writes while its child lives:
    ~200 per run for the server's own bookkeeping (measured). The zygote writes a few pages between
    clones, and its children are the server's (``clone(CLONE_PARENT)``), so the server still reaps
    them (exit status, rusage), signals them and is the parent their death signal watches.
    It is forked from a new thread: its only stack starts there, so no frame of the server (and
    nothing they hold) is reachable from a run's frames. That thread then parks for the server's
    lifetime: a parent-death signal fires when the parent *thread* ends.
    It is forked before the server reads any request, and it never receives one (the run does,
    on a pipe of its own), so it stays as it was forked for its whole life. When it dies, the
    server takes no more requests (``Server.retire``): a server that has read requests never
    becomes the process runs are cloned from, and the caller starts a fresh server.
    Protocol: on a UNIX stream socket, one byte with two descriptors attached (``SCM_RIGHTS``): the
    write end of the run's result pipe and the read end of its request pipe; the answer, on a pipe,
    is the pid (or -errno), 8 bytes.
    """

    def __init__(self, clone: Callable[[], int], server: int, devnull: int):
        self.commands, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.replies, rep_w = os.pipe()
        kit = [zygote_end, rep_w, clone, server, devnull]
        forked = _thread.allocate_lock()
        forked.acquire()
        pids: list[int] = []

        def fork_here() -> None:
            pid = os.fork()
            if pid == 0:
                try:
                    _zygote_main(kit)
                finally:
                    os._exit(0)
            pids.append(pid)
            forked.release()
            # the zygote's parent-death signal (and, through CLONE_PARENT, every run's) watches this
            # thread, not the process: it must live as long as the server
            park = _thread.allocate_lock()
            park.acquire()
            park.acquire()

        _thread.start_new_thread(fork_here, ())
        forked.acquire()
        self.pid: int | None = pids[0]
        zygote_end.close()
        os.close(rep_w)

    def clone(self, result_fd: int, request_fd: int) -> int | None:
        """The pid of a new child of ours that reads its request from ``request_fd`` and answers on
        ``result_fd``; None (and the zygote closed) on failure."""
        fds = result_fd.to_bytes(4, sys.byteorder) + request_fd.to_bytes(4, sys.byteorder)
        try:
            self.commands.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            reply = os.read(self.replies, 8)
        except OSError:
            reply = b""
        pid = int.from_bytes(reply, "little", signed=True) if len(reply) == 8 else -1
        if pid <= 0:
            self.close()
            return None
        return pid

    def close(self) -> None:
        if self.pid is None:
            return
        self.commands.close()
        os.close(self.replies)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self.pid = None


def _send_request(fd: int, payload: bytes) -> None:
    """Write a run's request on its pipe and close it. The run reads it as soon as it is cloned, so
    the write waits only on our own code in the run; a run that died first leaves the write
    failing, and its exit gives its verdict."""
    view = memoryview(payload)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError:
        pass
    finally:
        os.close(fd)


class _Running:
    """A child in flight: its pid, pidfd, result pipe (read end; ``open`` until end of file or the
    bound), deadline and slot; ``overflow`` once it wrote more than one frame may hold."""

    __slots__ = ("request", "pid", "pidfd", "read_fd", "workdir", "slot", "started", "deadline", "chunks", "size",
                 "killed", "open", "watched", "overflow", "bound")

    def __init__(self, request, pid, pidfd, read_fd, workdir, slot, started, deadline):
        self.request, self.pid, self.pidfd, self.read_fd = request, pid, pidfd, read_fd
        self.workdir, self.slot, self.started, self.deadline = workdir, slot, started, deadline
        self.chunks: list[bytes] = []
        self.size = 0
        self.killed = False
        self.open = self.watched = True
        self.overflow = False
        self.bound = frame_bound(int(request["max_output_chars"]))


class Server:
    """The serving loop, after the one-time setup in ``__init__`` (imports, kernel calls, user,
    namespaces, Landlock ruleset, seccomp program, result pipes)."""

    def __init__(self, uid_base: int, workers: int, settings: dict):
        global CONTEXT
        layers = {name: bool(settings.get("layers", {}).get(name, True)) for name in OS_LAYERS}
        # the benchmark profile: only modules of ``guard.BENCHMARK_MODULES`` may be added
        allowed = guard.ALLOWED_MODULES | (frozenset(settings.get("extra_modules") or ()) & guard.BENCHMARK_MODULES)
        _import_allowed_modules(allowed)
        ctx = Context()
        ctx.builtins = guard.prepare(ctx.deny, allowed)
        ctx.kernel = kernel = syscalls.load()
        if kernel is not None:
            ctx.drop_capabilities = functools.partial(namespaces.drop_capabilities, kernel)
        self.no_new_privs = kernel is not None and kernel.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1) == 0
        ctx.devnull = _above_result_fd(os.open(os.devnull, os.O_RDWR))
        user = settings.get("server_user")
        if user is not None and os.getuid() == 0:  # run as an ordinary user from here on
            os.setgroups([])
            os.setresgid(user, user, user)
            os.setresuid(user, user, user)
            if kernel is not None:
                kernel.prctl(syscalls.PR_SET_DUMPABLE, 1)  # a uid change clears it; /proc/self/uid_map needs it
        self.root = ctx.host_root = os.getuid() == 0
        ctx.credentials = self.root and layers["credentials"]
        ctx.process_limits = layers["process_limits"]
        # a block of UIDS_PER_SERVER uids per server, picked by the host pid, so that runs of different
        # servers on one machine (several verifier actors) do not share a uid either
        host_pid = os.getpid()
        self.uid_base = uid_base + (host_pid % UID_BLOCKS) * UIDS_PER_SERVER
        self.baseline_as = _address_space_in_use()  # /proc is out of sight once isolated
        self.isolation = {"isolated": False, "user_namespace": False, "server_pid": host_pid, "runs_dir": None,
                          "capabilities_dropped": False, "error": "switched off" if not layers["namespaces"] else ""}
        if layers["namespaces"] and kernel is not None:
            self.isolation = namespaces.isolate(kernel, self.root, self.uid_base, keep_capabilities=ctx.credentials)
        self.pid = os.getpid()
        if kernel is not None:
            # not dumpable from here on (the zygote and every run inherit it): a run of our uid (no root,
            # seccomp off) cannot read or write our memory, which holds every request, nor the zygote's
            kernel.prctl(syscalls.PR_SET_DUMPABLE, 0)
        self.landlock_abi = landlock.abi(kernel)
        ctx.python_guards = bool(settings.get("python_guards", True))
        if layers["landlock"] and self.landlock_abi and self.no_new_privs:
            ctx.restrict_landlock = functools.partial(landlock.restrict, kernel)
            ctx.landlock_fd = landlock.ruleset(kernel, self.landlock_abi)
            if ctx.landlock_fd >= 0:
                ctx.landlock_fd = _above_result_fd(ctx.landlock_fd)
        program = settings.get("seccomp")
        if layers["seccomp"] and program and self.no_new_privs and kernel is not None:
            program_bytes = base64.b64decode(program)
            ctx.seccomp = kernel.bpf_loader(program_bytes, placeholder_offsets(program_bytes)[0])
        self.layers = layers
        CONTEXT = ctx
        # per-run directories: on the namespace's own tmpfs as root, none in an isolated server without
        # root (its read-only root is empty already), else on the host's tmpfs
        if self.isolation["isolated"]:
            self.base = self.isolation["runs_dir"]
        else:
            scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self.base = tempfile.mkdtemp(prefix="verifier-", dir=scratch)
            os.chmod(self.base, 0o711)
        self.selector = selectors.DefaultSelector()
        self.pending: deque[dict] = deque()
        self.running: dict[int, _Running] = {}  # by pidfd
        self.free_slots = list(range(max(1, workers) - 1, -1, -1))
        self.zygote: _Zygote | None = None
        number = kernel.numbers.get("clone") if kernel is not None else None
        self.clone = None if number is None else (lambda: kernel.syscall(number, CLONE_PARENT | int(signal.SIGCHLD)))
        self.counter = 0
        self.inbuf = b""
        self.outbox: list[bytes] = []
        self.unsent = memoryview(b"")  # what the last write to stdout left (stdout is non-blocking)
        self.writing = False  # stdout is watched for room
        self.closing = False
        # the caller, whose death ends us even where another process keeps our pipes open; inside
        # the PID namespace the parent is out of sight, and the keeper watches the caller instead
        self.caller = None if self.isolation["isolated"] else os.getppid()

    def send(self, message: dict) -> None:
        """Queue one JSON line; ``flush`` writes the queue once per turn of the loop (one syscall)."""
        self.outbox.append(json.dumps(message).encode() + b"\n")

    def flush(self) -> None:
        """Write what stdout takes now, never waiting: a caller that does not read holds up no run,
        no deadline and no request of ours. What is left waits for room (``EVENT_WRITE``)."""
        if not self.unsent and self.outbox:
            self.unsent = memoryview(b"".join(self.outbox))
            self.outbox.clear()
        try:
            while self.unsent:
                self.unsent = self.unsent[os.write(1, self.unsent) :]
        except BlockingIOError:
            pass
        except OSError:  # the caller is gone: nobody wants the results
            self.unsent, self.outbox = memoryview(b""), []
            self.stop()
        waiting = bool(self.unsent)
        if waiting != self.writing:
            self.writing = waiting
            if waiting:
                self.selector.register(1, selectors.EVENT_WRITE, ("stdout", None))
            else:
                self.selector.unregister(1)

    def retire(self) -> None:
        """Take no more requests: the runs in flight finish and report, and the caller, at the end
        of our output, retries the requests we did not run on a fresh server."""
        if not self.closing:
            self.closing = True
            self.selector.unregister(0)
        self.pending.clear()

    def stop(self) -> None:
        """Stop reading requests and kill every run in flight."""
        self.retire()
        for run in self.running.values():
            run.killed = True
            self.kill(run)

    # --- children -----------------------------------------------------------------------------
    def spawn(self, request: dict) -> bool:
        """Have the zygote clone a run of ``request`` and send the run its request; False (nothing
        started) when the zygote is gone."""
        if self.zygote is None:
            return False
        slot = self.free_slots.pop()
        self.counter += 1
        if self.base is None:  # isolated, no per-run uid: every run starts in the empty read-only root
            workdir = "/"
        else:
            workdir = os.path.join(self.base, str(self.counter))
            os.mkdir(workdir, 0o555)
        # a new result pipe for every run: nothing a run does to it (size, flags, owner) outlives the run;
        # and a new request pipe, which only the run reads
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        request_r, request_w = os.pipe()
        address_space = self.baseline_as + int(request["memory_mb"]) * 1024 * 1024
        uid = self.uid_base + slot % UIDS_PER_SERVER
        started = time.monotonic()
        pid = self.zygote.clone(write_fd, request_r)
        os.close(write_fd)  # the run holds the only write end now: its exit is the pipe's end of file
        os.close(request_r)
        if pid is None:
            self.zygote = None
            os.close(read_fd)
            os.close(request_w)
            self.free_slots.append(slot)
            if self.base is not None:
                os.rmdir(workdir)
            return False
        _send_request(request_w, marshal.dumps((request, workdir, uid, address_space)))
        pidfd = os.pidfd_open(pid)
        run = _Running(request, pid, pidfd, read_fd, workdir, slot, started, started + float(request["timeout_s"]))
        self.running[pidfd] = run
        self.selector.register(pidfd, selectors.EVENT_READ, ("exit", run))
        self.selector.register(read_fd, selectors.EVENT_READ, ("pipe", run))
        return True

    def drain(self, run: _Running) -> None:
        """Read what the child wrote so far. At end of file, or once it wrote more than one frame
        may hold (``frames.frame_bound``; the run is killed then), the pipe is closed: the server
        never keeps more than the bound of any run, however much it writes. Once a whole frame has
        arrived the pipe is no longer watched: the run's exit ends it (``finish`` reads what came
        after the frame, a violation), so the end of file costs no wakeup of its own."""
        while run.open:
            try:
                chunk = os.read(run.read_fd, 65536)
            except BlockingIOError:
                if run.watched and run.size >= HEADER_BYTES:
                    head = run.chunks[0] if len(run.chunks[0]) >= HEADER_BYTES else b"".join(run.chunks)
                    if run.size >= HEADER_BYTES + int.from_bytes(head[1:HEADER_BYTES], "little"):
                        run.watched = False
                        self.selector.unregister(run.read_fd)
                return
            if chunk:
                run.chunks.append(chunk)
                run.size += len(chunk)
                if run.size <= run.bound:
                    continue
                run.overflow = True
                self.kill(run)
            self.close_pipe(run)

    def close_pipe(self, run: _Running) -> None:
        if run.open:
            run.open = False
            if run.watched:
                run.watched = False
                self.selector.unregister(run.read_fd)
            os.close(run.read_fd)

    @staticmethod
    def kill(run: _Running) -> None:
        """SIGKILL the child's process group (and the child, in case it died before ``setsid``)."""
        for target, pid in ((os.killpg, run.pid), (os.kill, run.pid)):
            try:
                target(pid, signal.SIGKILL)
            except OSError:
                pass

    def finish(self, run: _Running) -> None:
        self.kill(run)  # a zombie leader keeps its process-group id reserved, so this hits nothing else
        _, wait_status, usage = os.wait4(run.pid, 0)
        self.drain(run)  # the child is gone: what it wrote is all in the pipe now
        self.close_pipe(run)
        self.selector.unregister(run.pidfd)
        os.close(run.pidfd)
        del self.running[run.pidfd]
        self.free_slots.append(run.slot)
        if self.base is not None:
            try:
                os.rmdir(run.workdir)
            except OSError:
                shutil.rmtree(run.workdir, ignore_errors=True)
        result = self.verdict(run, wait_status, usage.ru_utime + usage.ru_stime)
        result["id"] = run.request.get("id")
        result["wall_s"] = round(time.monotonic() - run.started, 6)
        self.send(result)

    @staticmethod
    def verdict(run: _Running, wait_status: int, cpu_s: float) -> dict:
        """The result of a reaped child; a result it wrote counts only after a clean exit."""
        if run.killed:
            return {"status": "timeout", "output": None, "error": f"wall-clock limit of {float(run.request['timeout_s']):g} s exceeded"}
        if run.overflow:
            return violation(f"more than {run.bound} bytes written to the result pipe (one frame's bound)")
        if os.WIFSIGNALED(wait_status):
            sig = os.WTERMSIG(wait_status)
            name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
            cpu_limit = int(math.ceil(float(run.request["timeout_s"]))) + 1
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= cpu_limit - 0.05):
                return {"status": "timeout", "output": None, "error": f"CPU time limit of {cpu_limit} s exceeded ({name})"}
            return {"status": "crashed", "output": None, "error": f"killed by {name}"}
        code = os.WEXITSTATUS(wait_status)
        if code != 0:
            return {"status": "crashed", "output": None, "error": f"exited with code {code} and no result"}
        return decode_frame(b"".join(run.chunks), int(run.request["max_output_chars"]), bool(run.request.get("probe")))

    # --- requests -----------------------------------------------------------------------------
    def read_requests(self) -> None:
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:  # the host is gone or closed us: stop every run now
            self.stop()
            return
        *lines, self.inbuf = (self.inbuf + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self.accept(line)

    def accept(self, line: bytes) -> None:
        request: dict = {}
        try:
            request = json.loads(line)
            for key in ("timeout_s", "memory_mb", "max_output_chars"):
                float(request[key])
            if not request.get("probe") and not (isinstance(request["code"], str) and isinstance(request["args"], str)):
                raise ValueError("code and args must be strings")
        except Exception as exc:
            rid = request.get("id") if isinstance(request, dict) else None
            self.send({"id": rid, "status": "crashed", "output": None, "error": f"malformed request: {exc}"})
            return
        self.pending.append(request)

    def serve(self) -> None:
        os.set_blocking(0, False)
        os.set_blocking(1, False)
        self.selector.register(0, selectors.EVENT_READ, ("stdin", None))
        # before the freeze: gc.get_objects() does not list frozen objects
        CONTEXT.generators = [obj for obj in gc.get_objects() if isinstance(obj, _random.Random)]
        gc.freeze()  # keep the collector from touching (and so copying) the server's objects in children
        if self.clone is not None:
            self.zygote = _Zygote(self.clone, self.pid, CONTEXT.devnull)
        hello = {
            "no_new_privs": self.no_new_privs,
            "root": self.root,
            "pid": self.pid,  # as the server sees itself (1 in its own PID namespace)
            "server_pid": self.isolation["server_pid"],  # as the host sees it
            "scratch": None if self.isolation["isolated"] else self.base,
            "zygote": self.zygote.pid if self.zygote is not None else None,  # as the server sees it
            "zygote_error": "" if self.zygote is not None else (
                "no clone system call number for this machine (verifier.syscalls knows x86-64 and aarch64)"
                if CONTEXT.kernel is not None else "libc's syscall() could not be loaded"),
            "namespaces": self.isolation,
            "landlock_abi": self.landlock_abi,
            "landlock": CONTEXT.landlock_fd >= 0,
            "seccomp": CONTEXT.seccomp is not None,
            "credentials": CONTEXT.credentials,
            "layers": self.layers,
        }
        self.send({"hello": hello})
        while not (self.closing and not self.running and not self.unsent and not self.outbox):
            self.flush()
            while self.pending and self.free_slots and not self.closing:
                if not self.spawn(self.pending[0]):
                    # the zygote died: no run is ever cloned from this server itself; the caller
                    # gives what we did not run to a fresh server
                    self.send({"retired": "the zygote died"})
                    self.retire()
                    break
                self.pending.popleft()
            now = time.monotonic()
            wait = min((run.deadline for run in self.running.values() if not run.killed), default=now + CALLER_CHECK_S) - now
            for key, _ in self.selector.select(min(max(0.0, wait), CALLER_CHECK_S)):
                kind, run = key.data
                if kind == "stdin":
                    self.read_requests()
                elif kind == "stdout":
                    self.flush()
                elif kind == "pipe" and run.pidfd in self.running:
                    self.drain(run)
                elif kind == "exit" and run.pidfd in self.running:
                    self.finish(run)
            if self.caller is not None and os.getppid() != self.caller:  # the caller died: nobody reads us
                self.unsent, self.outbox = memoryview(b""), []
                self.stop()
            now = time.monotonic()
            for run in list(self.running.values()):
                if now >= run.deadline and not run.killed:
                    run.killed = True
                    self.kill(run)

    def shutdown(self) -> None:
        """Kill and reap every child still running, remove the scratch directories."""
        for run in list(self.running.values()):
            self.kill(run)
            try:
                os.waitpid(run.pid, 0)
            except OSError:
                pass
        if self.zygote is not None:
            self.zygote.close()
        if self.base is not None and not self.isolation["isolated"]:
            shutil.rmtree(self.base, ignore_errors=True)


def main(argv: list[str]) -> None:
    """Bootstrap entry: ``<root> serve <settings>``, the settings as base64 of a JSON object
    (``uid_base``, ``workers``, ``layers``, ``seccomp`` (base64 BPF or null), ``server_user``)."""
    settings = json.loads(base64.b64decode(argv[2]))
    # Set once here, inherited by every child: PYTHONHASHSEED has been read at startup and nothing
    # else is in the environment; SIGINT is the terminal's (the host ends us by closing stdin);
    # a write past RLIMIT_FSIZE fails with EFBIG instead of killing; SIGPIPE is already ignored;
    # SIGIO, whose default ends a process, is what a descriptor's owner gets (F_SETOWN, O_ASYNC):
    # ignored, so that no run that armed a descriptor can end the server or the zygote with it.
    os.environ.clear()
    for number in (signal.SIGINT, signal.SIGXFSZ, signal.SIGIO):
        signal.signal(number, signal.SIG_IGN)
    server = Server(int(settings["uid_base"]), int(settings["workers"]), settings)
    try:
        server.serve()
    finally:
        server.shutdown()
