"""The result protocol between a run and its fork server, attacked from inside the run.

A program holds its own result pipe (descriptor 3), and an allowed module leads to ``os``
(``dataclasses.sys.modules['os']``, whose ``write`` raises no audit event), so every program below
really writes to the descriptors a run holds, changes them, signals through them or disarms the
Python guard, in both postures (root, and the server as an ordinary user) and with the Python layer
on and off (so a fixed Python layer cannot hide an operating-system hole). Every batch mixes the
hostile programs with ordinary ones on one worker, so each ordinary run follows a hostile one on
the same server: every ordinary result must be exact, every hostile one an error or its honest
result, and the server must be the one the batch started with.
"""

from __future__ import annotations

import os
import random
import time

import psutil
import pytest

from verifier import ExecResult, Status, Verifier
from verifier.frames import HEADER_BYTES, KINDS, MAX_ERROR_BYTES, decode, encode, frame_bound
from verifier.sandbox import probe_report, result_of
from fork_servers import zygotes

IS_ROOT = os.geteuid() == 0
NOBODY = 65534
POSTURES = ["root", "user"] if IS_ROOT else ["user"]
SERVER_USER = {"root": None, "user": NOBODY if IS_ROOT else None}
MAX_CHARS = 1000
BOUND = frame_bound(MAX_CHARS)
# unaudited os, fcntl and builtins through an allowed module (the Python layer lets this through)
PRELUDE = "import dataclasses\nOS = dataclasses.sys.modules['os']\n"
ORDINARY = [
    ("def f(a):\n    return [a, a * 2, str(a)]", "{k}", "[{k}, {k2}, '{k}']"),
    ("def f(s):\n    return s[::-1] * 3", "'ab{k}'", None),
]


def ordinary(k: int) -> tuple[str, str, str]:
    program, args, expected = ORDINARY[k % len(ORDINARY)]
    args = args.format(k=k)
    if expected is None:
        expected = repr(f"ab{k}"[::-1] * 3)
    return program, args, expected.format(k=k, k2=2 * k)


def verifier(posture: str, guards: bool, **kwargs) -> Verifier:
    return Verifier(timeout_s=3.0, workers=1, max_output_chars=kwargs.pop("max_output_chars", MAX_CHARS),
                    python_guards=guards, server_user=SERVER_USER[posture], **kwargs)


def interleaved(v: Verifier, hostile: list[str], args: str = "7") -> tuple[list[ExecResult], list[ExecResult], list[str]]:
    """Run ordinary, hostile, ordinary, hostile, ... ordinary in one batch on ``v`` (one worker);
    returns the hostile verdicts, the ordinary verdicts and the ordinary programs' expected outputs."""
    items, expected = [], []
    for k, program in enumerate(hostile):
        prog, a, out = ordinary(k)
        items += [(prog, a), (program, args)]
        expected.append(out)
    prog, a, out = ordinary(len(hostile))
    items.append((prog, a))
    expected.append(out)
    results = v.execute_many(items, repeats=1)
    return results[1::2], results[0::2], expected


def assert_same_servers(v: Verifier, before: list[int]) -> None:
    """No restart visible: the same serving processes, alive."""
    assert [s.proc.pid for s in v._pool.servers] == before
    assert all(s.alive() for s in v._pool.servers)


def honest_or_error(result: ExecResult, honest: str) -> bool:
    return (result.ok and result.output == honest) or (not result.ok and result.error != "")


# --- the frame format, alone -------------------------------------------------------------------

def test_frames_round_trip_and_every_violation_is_named():
    assert decode(encode("ok", "", "[1, 'é\\udc80']"), MAX_CHARS, False) == {"status": "ok", "output": "[1, 'é\\udc80']", "error": ""}
    assert decode(encode("runtime_error", "ValueError: x\0y"), MAX_CHARS, False)["error"] == "ValueError: x\0y"
    assert decode(encode("probe", "", '{"seccomp": true}'), MAX_CHARS, True)["probe"] == '{"seccomp": true}'
    good = encode("ok", "", "42")
    cases = {
        b"": "no frame",
        good[:3]: "torn frame header",
        bytes((0,)) + good[1:]: "unknown frame kind 0",
        bytes((200,)) + good[1:]: "unknown frame kind 200",
        good[:-1]: "torn frame",
        good + good: "bytes after the frame",
        good + b"\0": "bytes after the frame",
        good[:1] + (BOUND).to_bytes(4, "little") + good[5:]: "more than the bound",
        good[:1] + (2**32 - 1).to_bytes(4, "little"): "more than the bound",
        bytes((1,)) + (1).to_bytes(4, "little") + b"\0": "without its error length",
        bytes((1,)) + (4).to_bytes(4, "little") + (MAX_ERROR_BYTES + 1).to_bytes(2, "little") + b"ab": "error field",
        bytes((1,)) + (4).to_bytes(4, "little") + (0).to_bytes(2, "little") + b"\xff\xfe": "not UTF-8",
        encode("forbidden", "no", "x"): "carrying an output",
        encode("probe", "", "{}"): "probe frame from a program run",
    }
    for data, reason in cases.items():
        verdict = decode(data, MAX_CHARS, False)
        assert verdict["status"] == "crashed" and "protocol violation" in verdict["error"] and reason in verdict["error"], (data[:20], verdict)
    assert "answering a probe" in decode(good, MAX_CHARS, True)["error"]
    too_long = decode(encode("ok", "", "7" * (MAX_CHARS + 1)), MAX_CHARS, False)
    assert too_long["status"] == "output_too_large" and too_long["output"] is None
    assert len(encode("runtime_error", "x" * 5000)) == HEADER_BYTES + 2 + MAX_ERROR_BYTES


def test_the_caller_checks_every_result_line_again():
    assert result_of({"status": "ok", "output": "1", "error": ""}, 10) == ExecResult(Status.OK, "1", "", 0.0)
    assert result_of({"status": "ok", "output": "1" * 11}, 10).status is Status.OUTPUT_TOO_LARGE
    for message in ({"status": "ok", "output": None}, {"status": "probe"}, {"status": "ok", "output": ["1"]}, None, "x", {}):
        assert result_of(message, 10).status is Status.CRASHED, message
    assert result_of({"status": "runtime_error", "output": "leak", "error": 5}, 10) == ExecResult(Status.RUNTIME_ERROR, None, "", 0.0)
    assert probe_report({"probe": "[" * 100_000}) == {}
    assert probe_report({"probe": '{"a": [1], "b": true}'}) == {"b": True}


# --- forged frames, from inside real runs --------------------------------------------------------

def writes(data: bytes, then: str = "return a") -> str:
    return PRELUDE + f"def f(a):\n    OS.write(3, {data!r})\n    {then}"


def generated(expression: str, then: str = "return a") -> str:
    """A program that writes the bytes ``expression`` builds in the run (too large for the source)."""
    return PRELUDE + f"def f(a):\n    data = {expression}\n    view = 0\n    while view < len(data):\n" \
        f"        view += OS.write(3, data[view:])\n    {then}"


EXIT = "OS._exit(0)"
# (program, the status it must get, a piece of its error or its exact output)
FORGED = {
    "ok claimed, then exit": (writes(encode("ok", "", "42"), EXIT), Status.OK, "42"),
    "forbidden claimed, then exit": (writes(encode("forbidden", "forged"), EXIT), Status.FORBIDDEN, "forged"),
    "probe claimed": (writes(encode("probe", "", '{"seccomp": false}'), EXIT), Status.CRASHED, "probe frame from a program run"),
    "nested probe within the bound": (writes(encode("probe", "", "[" * 4000), EXIT), Status.CRASHED, "probe frame"),
    "nested probe past the bound": (generated("bytes((8,)) + (200000).to_bytes(4, 'little') + b'\\0\\0' + b'[' * 200000", EXIT),
                                    Status.CRASHED, "protocol violation"),
    "nested output": (writes(encode("ok", "", "[" * 450 + "]" * 450), EXIT), Status.BAD_OUTPUT, "not a Python literal"),
    "recursion marker": (writes(encode("ok", "", "[[...]]"), EXIT), Status.BAD_OUTPUT, "'...'"),
    "not a literal": (writes(encode("ok", "", "__import__('os')"), EXIT), Status.BAD_OUTPUT, "not a Python literal"),
    "output over the bound": (writes(encode("ok", "", "1" * (MAX_CHARS + 1)), EXIT), Status.OUTPUT_TOO_LARGE, "bound is"),
    "timeout claimed": (writes(b"\x09" + encode("ok", "", "1")[1:], EXIT), Status.CRASHED, "unknown frame kind 9"),
    "length past the bound": (writes(b"\x01" + (2**32 - 1).to_bytes(4, "little") + b"\0\0", EXIT), Status.CRASHED, "bound"),
    "torn header": (writes(b"\x01\x05", EXIT), Status.CRASHED, "torn frame header"),
    "torn body": (writes(encode("ok", "", "12345")[:-2], EXIT), Status.CRASHED, "torn frame"),
    "two frames": (writes(encode("ok", "", "1") * 2, EXIT), Status.CRASHED, "bytes after the frame"),
    "a frame, then the real one": (writes(encode("ok", "", "42")), Status.CRASHED, "bytes after the frame"),
    "garbage, then the real one": (writes(b"\x00\xff" * 10), Status.CRASHED, "protocol violation"),
    "flood": (generated("b'x' * 4_000_000"), Status.CRASHED, "more than"),
    "bad UTF-8": (writes(b"\x01" + (4).to_bytes(4, "little") + b"\0\0\xff\xfe", EXIT), Status.CRASHED, "not UTF-8"),
    "flood on stdout and stderr": (PRELUDE + "def f(a):\n    for fd in (0, 1, 2):\n        try:\n            OS.write(fd, b'\\x01' * 100000)\n"
                                   "        except OSError:\n            pass\n    return a", Status.OK, "7"),
    "closed result pipe": (PRELUDE + "def f(a):\n    OS.close(3)\n    return a", Status.CRASHED, "no result"),
}


@pytest.mark.parametrize("guards", [True, False], ids=["python_guards", "no_python_guards"])
@pytest.mark.parametrize("posture", POSTURES)
def test_forged_frames_get_their_writers_verdict_only(posture, guards):
    names = list(FORGED)
    with verifier(posture, guards) as v:
        servers = [s.proc.pid for s in v._pool_for_use().servers]
        hostile, plain, expected = interleaved(v, [FORGED[name][0] for name in names])
        assert [r.output for r in plain] == expected, [r for r in plain if not r.ok]
        for name, result in zip(names, hostile):
            _, status, detail = FORGED[name]
            assert result.status is status, (name, result)
            assert detail in (result.output if status is Status.OK else result.error), (name, result)
        assert_same_servers(v, servers)


# --- descriptors: size, flags, owners ------------------------------------------------------------

FCNTL = PRELUDE + "FC = dataclasses.sys.modules['fcntl']\n"
DESCRIPTOR_ATTACKS = {
    "pipe size": ["FC.fcntl(fd, 1031, 4096)"],  # F_SETPIPE_SZ: ordinary outputs over 4 KB would block
    "non-blocking": ["FC.fcntl(fd, FC.F_SETFL, FC.fcntl(fd, FC.F_GETFL) | OS.O_NONBLOCK)"],
    "owner and signal": ["FC.fcntl(fd, 10, 9)", "FC.fcntl(fd, FC.F_SETOWN, -OS.getpgid(OS.getppid()))",  # F_SETSIG SIGKILL
                         "FC.fcntl(fd, FC.F_SETFL, FC.fcntl(fd, FC.F_GETFL) | 0o20000)"],  # O_ASYNC
}


def block(statements: list[str], indent: int) -> str:
    return "".join(" " * indent + line + "\n" for line in statements)


def descriptor_attack(change: list[str]) -> str:
    """Change every descriptor the run holds, then return honestly."""
    return FCNTL + "def f(a):\n    for fd in (0, 1, 2, 3):\n        try:\n" + block(change, 12) + \
        "        except OSError:\n            pass\n    return a"


@pytest.mark.parametrize("seccomp", [True, False], ids=["seccomp", "no_seccomp"])
@pytest.mark.parametrize("guards", [True, False], ids=["python_guards", "no_python_guards"])
@pytest.mark.parametrize("posture", POSTURES)
def test_descriptor_changes_end_with_their_run(posture, guards, seccomp):
    """Ordinary runs with outputs far over a shrunk pipe's 4 KB follow each attack on the same
    worker; with seccomp the changes fail, without it they apply to that run's own pipe only."""
    big = "def f(n):\n    return 'x' * n"
    with verifier(posture, guards, max_output_chars=200_000, disable=() if seccomp else ("seccomp",), allow_weak=not seccomp) as v:
        servers, helpers = [s.proc.pid for s in v._pool_for_use().servers], zygotes(v)
        items = []
        for change in DESCRIPTOR_ATTACKS.values():
            items += [(descriptor_attack(change), "7"), (big, "100000"), (big, "3000")]
        results = v.execute_many(items, repeats=1)
        for name, attacked, after, small in zip(DESCRIPTOR_ATTACKS, results[0::3], results[1::3], results[2::3]):
            assert attacked.status in (Status.OK, Status.FORBIDDEN) and honest_or_error(attacked, "7"), (name, attacked)
            assert after.ok and after.output == repr("x" * 100000), (name, after.status, after.error)
            assert small.ok and small.output == repr("x" * 3000), (name, small)
        assert_same_servers(v, servers)
        assert all(z.is_running() for z in helpers) and zygotes(v) == helpers


SIGNAL_ROUTES = {
    "kill the server": ["OS.kill(OS.getppid(), 9)"],
    "kill the server's group": ["OS.killpg(OS.getpgid(OS.getppid()), 9)"],
    # the server and the zygote share a process group; the signal comes when the server reads the
    # pipe (while the run lives: a closed descriptor notifies nobody)
    "a descriptor's owner": DESCRIPTOR_ATTACKS["owner and signal"] + ["OS.write(3, b'x')", "dataclasses.sys.modules['time'].sleep(0.3)"],
}


def signaller(route: str) -> str:
    return FCNTL + "def f(a):\n    fd = 3\n    try:\n" + block(SIGNAL_ROUTES[route], 8) + "    except OSError:\n        pass\n    return a"


def signal_layers(posture: str) -> list[tuple[str, tuple[str, ...]]]:
    """Each layer that confines signals on its own here, with the layers to switch off for it."""
    out = [("seccomp", ("namespaces", "landlock", "credentials")), ("landlock", ("namespaces", "seccomp", "credentials"))]
    if posture == "root":
        out.append(("credentials", ("namespaces", "landlock", "seccomp")))
    return out


@pytest.mark.parametrize("posture", POSTURES)
def test_each_signal_layer_alone_keeps_server_and_zygote_alive(posture):
    """The Python layer off; one layer of ``signals_confined`` at a time against every route to the
    server and the zygote (kill, their process group, a descriptor's signal owner)."""
    for layer, off in signal_layers(posture):
        with verifier(posture, False, disable=off, allow_weak=True) as v:
            report = v.defences()
            if layer not in report["guarantees"]["signals_confined"]:
                continue  # not on this machine (Landlock < 6, or no seccomp): reported, not claimed
            assert report["signals_confined"] and report["guarantees"]["signals_confined"] == [layer]
            servers, helpers = [s.proc.pid for s in v._pool_for_use().servers], zygotes(v)
            hostile, plain, expected = interleaved(v, [signaller(route) for route in SIGNAL_ROUTES])
            assert [r.output for r in plain] == expected, (layer, plain)
            # the owner route writes a byte of its own to arm the signal: that run's verdict is a violation
            assert all(honest_or_error(r, "7") and "died" not in r.error for r in hostile), (layer, hostile)
            time.sleep(0.1)
            assert_same_servers(v, servers)
            assert all(z.is_running() for z in helpers) and zygotes(v) == helpers, layer


@pytest.mark.parametrize("posture", POSTURES)
def test_a_run_that_kills_its_server_takes_no_other_run_with_it(posture):
    """The control: with no layer that confines signals (the run has the server's uid), a run kills
    its server. ``signals_confined`` says so, the run is retried alone once and gets CRASHED, and
    every other program of the batch still gets its own verdict."""
    with verifier(posture, False, disable=("namespaces", "landlock", "seccomp", "credentials"), allow_weak=True) as v:
        report = v.defences()
        assert not report["signals_confined"] and report["guarantees"]["signals_confined"] == []
        hostile, plain, expected = interleaved(v, [signaller("kill the server"), signaller("a descriptor's owner")])
        assert [r.output for r in plain] == expected
        for result in hostile:
            assert result.status is Status.CRASHED and "again when it ran alone" in result.error, result


# --- the Python guard, disarmed -------------------------------------------------------------------

DISARM = (
    "import dataclasses\n"
    "M = dataclasses.sys.modules\n"
    "B = M['builtins']\n"
    "def quiet(*args, **kwargs):\n    return None\n"
    "def disarm():\n"
    "    deny = B.getattr(M['signal'].pidfd_send_signal, '__closure__')[0].cell_contents\n"
    "    for cell in B.getattr(deny, '__closure__'):\n"
    "        if callable(cell.cell_contents):\n"
    "            cell.cell_contents = quiet\n"
)
AUDITED = {
    "read": "B.open({canary!r}).read()",
    "write": "B.open({new!r}, 'w').write('pwned')",
    "command": "M['os'].system('touch {new}')",
    "signal": "M['os'].kill({victim}, 9)",
    "network": "B.getattr(B, '__import__')('socket').create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'pwned')",
}


@pytest.mark.parametrize("posture", POSTURES)
def test_a_disarmed_guard_leaves_the_os_layers_holding(posture, tmp_path):
    """The guard's state is reachable from program code (through the real builtins), so a program
    can disarm it; then every audited call runs, and meets the operating-system layers."""
    from tcp_listener import tcp_listener  # noqa: PLC0415

    tmp_path.chmod(0o777)
    canary = tmp_path / "canary.txt"
    canary.write_text("precious")
    canary.chmod(0o666)
    new = tmp_path / "new.txt"
    victim = psutil.Popen(["sleep", "60"], **({"user": NOBODY, "group": NOBODY, "extra_groups": []} if IS_ROOT else {}))
    try:
        with tcp_listener() as (port, received), verifier(posture, True) as v:
            report = v.defences()
            assert report["python_layer"].startswith("convenience")
            assert all("python" not in " ".join(layers) for layers in report["guarantees"].values())
            programs = {name: DISARM + "def f(a):\n    disarm()\n    return repr(" + call.format(
                canary=str(canary), new=str(new), victim=victim.pid, port=port) + ")" for name, call in AUDITED.items()}
            programs["no disarm"] = "import dataclasses\ndef f(a):\n    return dataclasses.sys.modules['builtins'].open('/x')"
            results = dict(zip(programs, v.execute_many([(p, "0") for p in programs.values()], repeats=1)))
            assert results["no disarm"].status is Status.FORBIDDEN  # armed, the guard ends the run
            for name in AUDITED:  # disarmed, the guard stopped nothing; an OS layer did (checked below)
                assert results[name].status is not Status.FORBIDDEN, (name, results[name])
            assert "precious" not in (results["read"].output or "")
            assert results["command"].output in (None, repr(str(127 << 8)), repr("-1"))  # the shell never ran
            time.sleep(0.1)
            assert canary.read_text() == "precious" and not new.exists()
            assert victim.poll() is None and received == []
    finally:
        victim.kill()
        victim.wait()


# --- a seeded fuzz over every descriptor a run holds ------------------------------------------------

def fuzz_program(rng: random.Random) -> str:
    """Write random or malformed frames to random descriptors (0-3, and some it does not hold),
    then return honestly."""
    writes_ = []
    for _ in range(rng.randint(1, 3)):
        fd = rng.choice([0, 1, 2, 3, 3, 3, 5])
        shape = rng.randrange(6)
        if shape == 0:
            data = rng.randbytes(rng.randint(1, 64))
        elif shape == 1:
            data = encode(rng.choice(list(KINDS)), "e" * rng.randint(0, 50), repr(rng.random()))
        elif shape == 2:
            data = bytes((rng.randrange(256),)) + rng.randrange(2**32).to_bytes(4, "little") + rng.randbytes(rng.randint(0, 16))
        elif shape == 3:
            good = encode("ok", "", repr(rng.randrange(10**6)))
            data = good[: rng.randrange(len(good))]
        elif shape == 4:
            data = encode("ok", "", "1") + rng.randbytes(rng.randint(1, 8))
        else:
            data = None  # a flood past the bound, built in the run
        expr = f"b'z' * {rng.choice([BOUND + 1, 3 * BOUND, 200_000])}" if data is None else repr(data)
        writes_.append(f"    try:\n        OS.write({fd}, {expr})\n    except OSError:\n        pass\n")
    return PRELUDE + "def f(a):\n" + "".join(writes_) + "    return a"


@pytest.mark.parametrize("guards", [True, False], ids=["python_guards", "no_python_guards"])
@pytest.mark.parametrize("posture", POSTURES)
def test_seeded_fuzz_of_the_result_channel(posture, guards):
    rng = random.Random(f"frames-{posture}-{guards}")
    hostile_programs = [fuzz_program(rng) for _ in range(60)]
    with verifier(posture, guards) as v:
        servers = [s.proc.pid for s in v._pool_for_use().servers]
        started = time.monotonic()
        hostile, plain, expected = interleaved(v, hostile_programs)
        assert [r.output for r in plain] == expected, [r for r in plain if not r.ok][:3]
        for program, result in zip(hostile_programs, hostile):
            assert honest_or_error(result, "7"), (program, result)
            assert "fork server died" not in result.error, (program, result)
        assert_same_servers(v, servers)
        assert time.monotonic() - started < 30


def test_a_probe_frame_needs_a_probe_request():
    """The server answers a probe only for a probe request; a program's probe frame is refused even
    when the program is alone (the report ``defences()`` reads came from the real probe)."""
    with Verifier(timeout_s=2.0, workers=1) as v:
        before = v.defences()
        result = v.execute(writes(encode("probe", "", '{"seccomp": false, "landlock": false}'), EXIT), "0")
        assert result.status is Status.CRASHED and "probe" in result.error
        assert v.defences() == before
