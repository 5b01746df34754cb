"""No run sees another run's data: attacks on what earlier runs leave behind, on the caller's I/O
and on the worker a run lands on.

Every test here attacks with real programs in real fork servers, in both postures (root, and the
server as an ordinary user) and, where the Python layer matters, with it on and off (off stands for
a program that has disarmed it, which the documentation says is possible). Memory is read from
outside through ``/proc/<pid>/mem``, which needs the test to be root (CI is); a control finds the
canaries where they must be (the server, which reads every request, and a run's own request in
that run), so a scan that finds nothing has looked.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from fork_servers import children, real_servers, zygotes
from verifier import Status, Verifier
from verifier.families import judge_answers, validate_proposals, values_equal
from verifier.literals import MAX_SHARED_HASH, LiteralError, read
from verifier.preflight import prepare_args, prepare_program
from verifier.prompts import Proposal, parse_arguments

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
POSTURES = ["root", "user"] if IS_ROOT else ["user"]
SERVER_USER = {"root": None, "user": NOBODY if IS_ROOT else None}
needs_root = pytest.mark.skipif(not IS_ROOT, reason="reading another process's memory through /proc/<pid>/mem needs root")
PRELUDE = "import dataclasses\nOS = dataclasses.sys.modules['os']\n"


def verifier(posture: str, guards: bool = True, **kwargs) -> Verifier:
    return Verifier(timeout_s=kwargs.pop("timeout_s", 5.0), workers=kwargs.pop("workers", 1), python_guards=guards,
                    server_user=SERVER_USER[posture], **kwargs)


def memory_holds(pid: int, needles: list[bytes]) -> set[bytes]:
    """The needles found in any readable mapping of process ``pid``."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            found.update(n for n in needles if n in chunk)
    return found


def canary_calls(token: str) -> tuple[tuple[str, str], str, list[bytes]]:
    """A call whose program, argument and output each hold ``token`` (the output only once the run
    built it), its output, and every form those take between the caller and a run."""
    program = f"def f(a):\n    secret = 'PROG{token}'\n    return 'OUT' + a[3:] + secret[-4:]"
    args = f"'ARG{token}'"
    output = repr(f"OUT{token}{token[-4:]}")
    forms = [f"PROG{token}".encode(), f"ARG{token}".encode(), f"OUT{token}".encode(), token.encode(),
             prepare_program(program).payload.encode(), prepare_args(args).payload.encode()]
    return (program, args), output, forms


SLEEPER = PRELUDE + "def f(a):\n    dataclasses.sys.modules['time'].sleep(3)\n    return a"


def a_run_in_flight(v: Verifier, call: tuple[str, str]) -> tuple[threading.Thread, psutil.Process]:
    """Start ``call`` (which sleeps) on ``v``'s one server; its run's process once it is running."""
    servers, helpers = real_servers(v), zygotes(v)
    thread = threading.Thread(target=v.execute, args=call, kwargs={"repeats": 1})
    thread.start()
    deadline = time.monotonic() + 5
    while not children(servers, helpers) and time.monotonic() < deadline:
        time.sleep(0.01)
    runs = children(servers, helpers)
    assert len(runs) == 1
    time.sleep(0.3)  # past reading its request and confining itself: asleep in the program
    return thread, runs[0]


@needs_root
@pytest.mark.parametrize("guards", [True, False])
@pytest.mark.parametrize("posture", POSTURES)
def test_no_earlier_request_is_in_the_memory_runs_are_cloned_from_or_in_a_run(posture, guards):
    with verifier(posture, guards) as v:
        call, output, forms = canary_calls(secrets.token_hex(12))
        results = v.execute_many([call] * 4)
        assert [r.output for r in results] == [output] * 4
        server = real_servers(v)[0]
        assert memory_holds(server.pid, forms[:1] + forms[4:]), "control: the server read the requests"
        zygote = zygotes(v)[0]
        assert memory_holds(zygote.pid, forms) == set()
        # a run: its own request is in its memory, no earlier one
        own_token = secrets.token_hex(12)
        thread, run = a_run_in_flight(v, (SLEEPER, f"'MINE{own_token}'"))
        seen = memory_holds(run.pid, forms + [f"MINE{own_token}".encode()])
        thread.join(timeout=10)
        assert seen == {f"MINE{own_token}".encode()}
        # the zygote killed: the runs after it come from a fresh server whose zygote never held a request
        zygote.kill()
        later, later_output, later_forms = canary_calls(secrets.token_hex(12))
        assert [r.output for r in v.execute_many([later] * 3)] == [later_output] * 3
        fresh = zygotes(v)[0]
        assert fresh.pid != zygote.pid
        assert memory_holds(fresh.pid, forms + later_forms) == set()
        thread, run = a_run_in_flight(v, (SLEEPER, "'x'"))
        seen = memory_holds(run.pid, forms + later_forms)
        thread.join(timeout=10)
        assert seen == set()


# An answer that has disarmed the Python layer (here: runs without it) and reaches ctypes through the
# collector, as the reported attack did: it finds its readable memory with madvise/access probes (no
# /proc in the empty root), decodes every base64 run of bytes it finds, and uses any program that
# reproduces the pairs the student was shown.
MEMORY_THIEF = '''
import gc, types, re, base64, binascii, marshal
SHOWN = {shown!r}
def _ctypes():
    gc.unfreeze()
    for o in gc.get_objects():
        if type(o) is types.FunctionType and o.__module__ == 'ctypes' and o.__name__ == 'string_at':
            return o.__globals__
def _readable(ct):
    libc = ct['CDLL'](None, use_errno=True)
    access = libc.access
    access.argtypes, access.restype = [ct['c_void_p'], ct['c_int']], ct['c_int']
    page = 4096
    seeds = sorted({{id(o) & ~(page - 1) for o in gc.get_objects()[::50]}})
    seen = set()
    for base in seeds:
        for direction in (1, -1):
            addr = base
            for _ in range(4096):
                if addr in seen:
                    break
                if access(addr, 0) == -1 and ct['get_errno']() == 14:
                    break
                seen.add(addr)
                addr += direction * page
    return sorted(seen)
def _stolen(ct):
    pages = _readable(ct)
    blob = b"".join(ct['string_at'](p, 4096) for p in pages)
    for match in re.finditer(rb"[A-Za-z0-9+/]{{80,}}={{0,2}}", blob):
        code = None
        for skip in range(4):  # a length byte before the text may look like base64 too
            text = match.group()[skip:]
            try:
                code = marshal.loads(binascii.a2b_base64(text[: len(text) - len(text) % 4]))
                break
            except Exception:
                continue
        if type(code) is not types.CodeType or '_stolen' in code.co_names:
            continue
        space = {{}}
        try:
            exec(code, space)
            g = space['f']
            if all(repr(g(*args)) == out for args, out in SHOWN):
                return g
        except Exception:
            continue
def f(x):
    THIEF = _stolen(_ctypes())
    return THIEF(x) if THIEF is not None else None
'''


@pytest.mark.parametrize("posture", POSTURES)
def test_a_code_f_answer_that_reads_or_copies_is_judged_wrong(posture):
    teacher = "def f(x):\n    return (x * 7919 + 13) % 1009"
    with verifier(posture, guards=False) as v:
        [checked] = validate_proposals(v, "code_f", [Proposal(inputs=[str(k) for k in (3, 8, 21, 55, 144, 377)],
                                                              message="a hidden map")], programs=[teacher], n_inputs=6)
        assert checked.valid
        task = checked.task
        shown = [(parse_arguments(i)[0], o) for i, o in task.shown_pairs()]
        honest = "<think></think><answer>```python\n" + teacher + "\n```</answer>"
        thief = "<think></think><answer>```python\n" + MEMORY_THIEF.format(shown=shown) + "\n```</answer>"
        verdicts = judge_answers(v, [(task, honest), (task, thief), (task, thief)])
        assert verdicts[0].correct  # the student's honest answer, earlier in the same batch
        assert [j.correct for j in verdicts[1:]] == [False, False], [j.reason for j in verdicts[1:]]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_proposal_that_draws_from_random_is_invalid_on_any_worker(workers):
    # random is not on the allow-list, but an allowed module leads to it without disarming anything
    draw = "import dataclasses\ndef f(a):\n    return [a, dataclasses.sys.modules['random'].random()]"
    seeded = ("import dataclasses\ndef f(a):\n    r = dataclasses.sys.modules['random']\n    r.seed(a)\n"
              "    return r.random()")
    with Verifier(timeout_s=5.0, workers=workers) as v:
        proposals = [Proposal(program=draw, inputs=["7"]) for _ in range(20)]
        verdicts = validate_proposals(v, "code_o", proposals)
        assert [c.valid for c in verdicts] == [False] * 20
        assert {c.status for c in verdicts} == {Status.NONDETERMINISTIC.value}
        # a program that seeds the generator itself stays reproducible
        assert all(c.valid for c in validate_proposals(v, "code_o", [Proposal(program=seeded, inputs=["7"])] * 4))


def big_program(k: int, astral: int) -> tuple[str, str]:
    """~99,000 characters of program returning ``astral`` characters outside the BMP (12 bytes of
    JSON each): request and result lines larger than a pipe holds."""
    return f"def f(a):\n    pad = '{'p' * 98_900}'\n    return chr(0x1F600 + {k}) * {astral} + pad[:1]", "0"


@pytest.mark.parametrize("limits", ["default", "evaluation"])
def test_batches_larger_than_the_pipes_never_hang(limits):
    chars = 20_000_000 if limits == "evaluation" else None
    astral = 400_000 if chars else 9_000
    settings = {"max_output_chars": chars, "max_program_chars": chars} if chars else {}
    with Verifier(timeout_s=10.0, workers=1, **settings) as v:
        done: list = []

        def batches() -> None:
            for round_ in range(3):
                results = v.execute_many([big_program(k, astral) for k in range(3)])
                done.append([r.status for r in results] == [Status.OK] * 3
                            and all(len(r.output) == astral + 3 for r in results))

        worker = threading.Thread(target=batches, daemon=True)
        worker.start()
        worker.join(timeout=120)
        assert not worker.is_alive(), "execute_many hung"
        assert done == [True, True, True]


def colliding_set(count: int, collide: bool = True) -> str:
    """The text of a set of ``count`` complex numbers that all hash to 0 (``hash(complex(a, b)) ==
    hash(a) + 1000003 * hash(b)``), or (``collide`` False) of as many of the same length that do not."""
    parts = [f"({1000003 * k}-{k}j)" if collide else f"({1000003 * k}+{k}j)" for k in range(2, count + 2)]  # hash(-1) is -2
    return "{" + ", ".join(parts) + "}"


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def test_hash_colliding_text_is_read_in_bounded_time():
    # bounded: about the time of reading as much text whose values do not collide (measured here, beside)
    text, plain = colliding_set(20_000), colliding_set(20_000, collide=False)
    assert len({hash(read(p)) for p in text[1:-1].split(", ")[:50]}) == 1  # they do collide
    assert len({hash(v) for v in read(plain)}) == 20_000

    def refused() -> None:
        with pytest.raises(LiteralError, match="one hash value"):
            read(text)
        assert not values_equal(text, text)
        with pytest.raises(ValueError, match="one hash value"):
            parse_arguments(text)

    def accepted() -> None:
        read(plain)
        assert values_equal(plain, plain)
        parse_arguments(plain)

    assert timed(refused) < 4 * timed(accepted) + 0.5
    # below the bound the same values are read exactly
    small = colliding_set(MAX_SHARED_HASH)
    assert read(small) == {complex(x) for x in small[1:-1].replace("(", "").replace(")", "").split(", ")}
    assert values_equal(small, small)
    # equal values sharing one hash (duplicates) are not refused
    assert read("{" + ", ".join(["(1, 2)"] * 500) + "}") == {(1, 2)}


def forged_set_frame(collide: bool) -> str:
    """A program that writes its own ok frame holding a set of 12,000 complex numbers (never built in the run)."""
    sign = "-" if collide else "+"
    return PRELUDE + (
        f"def f(a):\n    text = '{{' + ', '.join(f'({{1000003 * k}}{sign}{{k}}j)' for k in range(2, 12002)) + '}}'\n"
        "    body = bytes(2) + text.encode()\n    data = bytes([1]) + len(body).to_bytes(4, 'little') + body\n"
        "    view = 0\n    while view < len(data):\n        view += OS.write(3, data[view:])\n    OS._exit(0)")


@pytest.mark.parametrize("posture", POSTURES)
def test_a_hash_colliding_output_is_checked_in_bounded_time_beside_other_verifiers(posture):
    with verifier(posture, max_output_chars=300_000) as hostile, Verifier(timeout_s=5.0, workers=1) as ordinary:
        ordinary.execute("def f(a):\n    return a", "1")

        def beside(program: str):
            """The verdict of ``program`` and its time; the longest wait of ordinary executes meanwhile."""
            waits: list[float] = []
            stop = threading.Event()

            def steady() -> None:
                while not stop.is_set():
                    waits.append(timed(lambda: ordinary.execute("def f(a):\n    return a + 1", "1")))

            thread = threading.Thread(target=steady)
            thread.start()
            time.sleep(0.05)
            result: list = []
            took = timed(lambda: result.append(hostile.execute(program, "0", repeats=1)))
            stop.set()
            thread.join(timeout=30)
            return result[0], took, max(waits)

        control, control_took, control_wait = beside(forged_set_frame(collide=False))
        assert control.status is Status.OK
        result, took, wait = beside(forged_set_frame(collide=True))
        assert result.status is Status.BAD_OUTPUT and "one hash value" in result.error, result
        assert took < 4 * control_took + 1.0
        assert wait < 4 * control_wait + 0.5


CALLER = textwrap.dedent('''
    import os, sys, threading, time
    from verifier import Verifier
    v = Verifier(timeout_s=20.0, workers=1, max_output_chars=20_000_000, max_program_chars=20_000_000,
                 server_user={user})
    server = v._pool_for_use().servers[0]
    print(server.proc.pid, server.hello["server_pid"], flush=True)
    program = "def f(a):\\n    return 'y' * 8_000_000"
    threading.Thread(target=v.execute_many, args=([(program, "0")] * 6,), daemon=True).start()
    if os.fork() == 0:  # a process of the caller's that keeps every pipe of the caller open, and lives on
        time.sleep(60)
        os._exit(0)
    time.sleep(60)
''')


@pytest.mark.parametrize("posture", POSTURES)
def test_a_dead_caller_leaves_no_process_behind(posture):
    user = SERVER_USER[posture]
    caller = subprocess.Popen([sys.executable, "-c", CALLER.format(user=user)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              start_new_session=True)
    line = caller.stdout.readline().split()
    assert len(line) == 2, caller.stderr.read()[-2000:]
    keeper, server = (psutil.Process(int(x)) for x in line)
    family = {keeper, server, *server.children(recursive=True)}
    time.sleep(1.5)  # results of 8 MB each are waiting for a reader that does not read
    os.kill(caller.pid, signal.SIGSTOP)
    time.sleep(0.5)
    os.kill(caller.pid, signal.SIGKILL)
    caller.wait()
    gone, alive = psutil.wait_procs(list(family), timeout=10)
    survivors = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    os.killpg(caller.pid, signal.SIGKILL)  # the sleeper the caller forked
    assert survivors == []


FD_STATE = PRELUDE + ("fcntl = dataclasses.sys.modules['fcntl']\ndef f(a):\n    out = []\n    for fd in (0, 1, 2):\n        try:\n"
                      "            out.append(fcntl.fcntl(fd, fcntl.F_GETFL))\n        except OSError as exc:\n"
                      "            out.append(exc.errno)\n    return out")
FD_CHANGE = PRELUDE + ("fcntl = dataclasses.sys.modules['fcntl']\ndef f(a):\n    for fd in (0, 1, 2):\n        try:\n"
                       "            fcntl.fcntl(fd, fcntl.F_SETFL, OS.O_NONBLOCK | OS.O_APPEND)\n        except OSError:\n"
                       "            pass\n    return a")


@pytest.mark.parametrize("posture", POSTURES)
def test_standard_descriptors_are_each_runs_own(posture):
    with verifier(posture, guards=False, disable=("seccomp",)) as v:
        before = v.execute(FD_STATE, "0", repeats=1).output
        results = v.execute_many([(FD_CHANGE, "0"), (FD_STATE, "0"), (FD_CHANGE, "0"), (FD_STATE, "0")], repeats=1)
        assert [r.status for r in results] == [Status.OK] * 4
        assert results[1].output == results[3].output == before


# Programs that have disarmed the Python layer and reach ctypes and the socket module through the
# collector; with seccomp off nothing stops their raw system calls.
FROM_THE_HEAP = """import gc, types
def _module_of(module, name):
    gc.unfreeze()
    for o in gc.get_objects():
        if type(o) is types.FunctionType and o.__module__ == module and o.__name__ == name:
            return o.__globals__
def _libc():
    ct = _module_of('ctypes', 'string_at')
    return ct, ct['CDLL'](None, use_errno=True)
"""
SHM_LEAVE = FROM_THE_HEAP + """
def f(a):
    ct, libc = _libc()
    libc.shmat.restype = ct['c_void_p']
    sid = libc.shmget(4242, 4096, 0o1000 | 0o666)
    ct['memmove'](libc.shmat(sid, None, 0), b'SECRET-SHM', 10)
    return sid
"""
SHM_FIND = FROM_THE_HEAP + """
def f(a):
    ct, libc = _libc()
    libc.shmat.restype = ct['c_void_p']
    sid = libc.shmget(4242, 0, 0)
    return ct['string_at'](libc.shmat(sid, None, 0), 10).decode() if sid >= 0 else None
"""
KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
KEYS_LEAVE = FROM_THE_HEAP + f"""
def f(a):
    ct, libc = _libc()
    return [libc.syscall({KEYCTL[0]}, b'user', b'canary%d' % -ring, b'SECRET-KEY', 10, ring) >= 0 for ring in (-4, -5)]
"""
KEYS_FIND = FROM_THE_HEAP + f"""
def f(a):
    ct, libc = _libc()
    buf, found = ct['create_string_buffer'](64), []
    for ring in (-4, -5):
        key = libc.syscall({KEYCTL[1]}, 10, ring, b'user', b'canary%d' % -ring, 0)
        if key >= 0:
            found.append(buf.raw[:max(libc.syscall({KEYCTL[1]}, 11, key, buf, 64), 0)].decode())
    return found
"""
LISTEN = FROM_THE_HEAP + """
def f(a):
    sock = _module_of('socket', 'create_connection')
    server = sock['socket'](sock['AF_UNIX'], sock['SOCK_STREAM'])
    server.bind(b'\\0verifier-canary')
    server.listen(1)
    server.settimeout(2.0)
    try:
        server.accept()[0].sendall(b'SECRET-SOCKET')
    except OSError:
        pass
    return 0
"""
CONNECT = FROM_THE_HEAP + """
def f(a):
    import sys
    sock, sleep = _module_of('socket', 'create_connection'), sys.modules['time'].sleep
    for _ in range(40):
        client = sock['socket'](sock['AF_UNIX'], sock['SOCK_STREAM'])
        try:
            client.connect(b'\\0verifier-canary')
            return client.recv(64).decode()
        except OSError as exc:
            error = exc.errno
        sleep(0.05)
    return error
"""


@pytest.mark.parametrize("disable", [("seccomp",), ("seccomp", "namespaces")])
@pytest.mark.parametrize("posture", POSTURES)
def test_without_seccomp_no_ipc_object_or_key_reaches_the_next_run(posture, disable):
    with verifier(posture, guards=False, disable=disable) as v:
        results = v.execute_many([(SHM_LEAVE, "0"), (SHM_FIND, "0"), (KEYS_LEAVE, "0"), (KEYS_FIND, "0")], repeats=1)
        assert [r.status for r in results] == [Status.OK] * 4, [r.error for r in results]
        assert int(results[0].output) >= 0 and results[2].output == "[True, True]"  # the routes are open in a run
        assert results[1].output == "None" and results[3].output == "[]"


@pytest.mark.parametrize("disable", [("seccomp",), ("seccomp", "namespaces")])
def test_without_seccomp_concurrent_runs_share_no_abstract_socket(disable):
    with Verifier(timeout_s=5.0, workers=2, python_guards=False, disable=disable) as v:
        if "namespaces" in disable and v.defences()["landlock_abi"] < 6:
            pytest.skip("no Landlock signal and socket scope (ABI >= 6) here: with namespaces off nothing separates them")
        listened, connected = v.execute_many([(LISTEN, "0"), (CONNECT, "0")], repeats=1)
        assert listened.status is Status.OK and connected.status is Status.OK, (listened, connected)
        assert "SECRET" not in connected.output
