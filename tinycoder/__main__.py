"""``python -m tinycoder [--variant default|test|stronger] [--seed N]``: build (or find) the model, print its path."""

from __future__ import annotations

import argparse

from tinycoder import VARIANTS, build_here, ensure_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinycoder", description=__doc__)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", help="cache root (default: $XDG_CACHE_HOME/populora/tiny-coder)")
    parser.add_argument("--threads", type=int, help="torch threads for training (default: all usable cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--here", action="store_true",
                        help="build in this process (what ensure_model's child runs) instead of a child process")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    build = build_here if args.here else ensure_model
    print(build(args.variant, args.seed, cache_dir=args.cache_dir, progress=not args.quiet, threads=args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
