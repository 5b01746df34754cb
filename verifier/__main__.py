"""Command line for debugging a task by hand.

    python -m verifier run PROGRAM_FILE --args "'abc', [1, 2]"   # the verdict as JSON
    python -m verifier defences                                  # which defences are active here
    python -m verifier defences --as-user 65534                  # as root: what an ordinary user gets
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from verifier.defences import DEFAULT_REQUIRE, explain, missing
from verifier.prompt_preview import add_command as add_prompts_command
from verifier.prompt_preview import run as run_prompts
from verifier.sandbox import Verifier


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verifier", description="Run programs in the verifier sandbox.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run f(*args) of PROGRAM_FILE twice in the sandbox and print the verdict as JSON")
    run.add_argument("program_file", help="a Python file defining f ('-' reads standard input)")
    run.add_argument("--args", default="", help="argument-list text, e.g. \"'abc', [1, 2]\"")
    run.add_argument("--timeout-s", type=float, default=5.0)
    run.add_argument("--memory-mb", type=int, default=512)
    run.add_argument("--max-output-chars", type=int, default=10_000)
    run.add_argument("--repeats", type=int, default=2, help="runs in separate processes (outputs must agree)")
    run.add_argument("--no-python-guards", action="store_true", help="leave only the operating-system layer (testing)")
    defences = sub.add_parser("defences", help="print which defences are active on this machine (every layer)")
    defences.add_argument("--as-user", type=int, default=None, metavar="UID",
                          help="as root: report what a fork server running as this ordinary uid gets")
    defences.add_argument("--require", nargs="*", default=list(DEFAULT_REQUIRE),
                          help="defences to check (default: %(default)s); the exit status is 1 when one is missing")
    add_prompts_command(sub)  # python -m verifier prompts --style r1 --family code_i [--model DIR]
    args = parser.parse_args(argv)

    if args.command == "prompts":
        return run_prompts(args)
    if args.command == "defences":
        if args.as_user is not None and os.geteuid() != 0:
            parser.error("--as-user needs root (without root the report already is an ordinary user's)")
        with Verifier(server_user=args.as_user) as verifier:
            report = verifier.defences()
        absent = missing(report, args.require)
        report["required"], report["missing"] = list(args.require), absent
        print(json.dumps(report, indent=2))
        if absent:
            print(explain(absent, report), file=sys.stderr)
        return 1 if absent else 0
    try:
        program = sys.stdin.read() if args.program_file == "-" else open(args.program_file, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as exc:
        parser.error(f"cannot read {args.program_file}: {exc}")
    try:
        verifier = Verifier(
            timeout_s=args.timeout_s,
            memory_mb=args.memory_mb,
            max_output_chars=args.max_output_chars,
            python_guards=not args.no_python_guards,
        )
    except ValueError as exc:
        parser.error(str(exc))
    with verifier:
        result = verifier.execute(program, args.args, repeats=args.repeats)
    print(json.dumps(result.to_dict()))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
