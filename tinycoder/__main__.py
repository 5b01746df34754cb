"""``python -m tinycoder [--variant default|test] [--seed N]``: build (or find) the model, print its path."""

from __future__ import annotations

import argparse

from tinycoder import VARIANTS, ensure_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinycoder", description=__doc__)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", help="cache root (default: $XDG_CACHE_HOME/populora/tiny-coder)")
    parser.add_argument("--threads", type=int, help="torch threads for training (default: all usable cores)")
    args = parser.parse_args(argv)
    print(ensure_model(args.variant, args.seed, cache_dir=args.cache_dir, threads=args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
