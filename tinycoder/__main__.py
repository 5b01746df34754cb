"""``python -m tinycoder [build|snapshot] [--variant V] [--seed N]``: build (or find) a model, print its path.

    python -m tinycoder --variant test                  # the model ensure_model gives (shipped, cached or built)
    python -m tinycoder build --variant default --ship  # build into the cache, then ship it as tinycoder/models/default
    python -m tinycoder snapshot --variant stronger-large --save SAVE --out DIR   # a build's training save as a model
"""

from __future__ import annotations

import argparse
import platform

from tinycoder import VARIANTS, build_here, ensure_model, model_dir
from tinycoder.shipped import SHIPPED_SEED, ship


def machine() -> str:
    """What built a shipped model: CPU model, cores, whether it has native bf16 (the precision a build resolves)."""
    from tinycoder.settings import native_bf16
    from tinycoder.train import cpu_threads

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or platform.machine()) if platform.system() == "Linux" else platform.machine()
    return f"{cpu}, {cpu_threads()} threads, native bf16: {'yes' if native_bf16() else 'no'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinycoder", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", choices=("build", "snapshot"), default=None,
                        help="build: build into the cache even where a shipped model applies; snapshot: write a "
                             "training save of the build as a model directory (tinycoder.snapshot)")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", help="cache root (default: $XDG_CACHE_HOME/populora/tiny-coder)")
    parser.add_argument("--threads", type=int, help="torch threads for training (default: all usable cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--here", action="store_true",
                        help="build in this process (what ensure_model's child runs) instead of a child process")
    parser.add_argument("--ship", action="store_true",
                        help=f"with build: copy the build (seed {SHIPPED_SEED}) to tinycoder/models/<variant> with its checksums")
    parser.add_argument("--save", help="snapshot: the training save (default: the build's current train.pt)")
    parser.add_argument("--progress-dir", help="snapshot: the build's progress directory, or a copy of its corpus.jsonl "
                        "and prepared/ (default: the cache's <variant>-<key>.progress)")
    parser.add_argument("--out", help="snapshot: the model directory to write (must not exist)")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.ship and (args.command != "build" or args.seed != SHIPPED_SEED):
        parser.error(f"--ship goes with build and seed {SHIPPED_SEED}")
    if args.command == "snapshot":
        return _snapshot(parser, args)
    if args.command == "build":  # the cache, never the shipped copy
        from tinycoder.cache import cache_root

        cache_dir = args.cache_dir or cache_root()
        path = (build_here if args.here else ensure_model)(args.variant, args.seed, cache_dir=cache_dir,
                                                           progress=not args.quiet, threads=args.threads)
        if args.ship:
            command = f"python -m tinycoder build --variant {args.variant} --ship"
            path = ship(args.variant, path, machine(), command)
        print(path)
        return 0
    build = build_here if args.here else ensure_model
    print(build(args.variant, args.seed, cache_dir=args.cache_dir, progress=not args.quiet, threads=args.threads))
    return 0


def _snapshot(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from tinycoder.cache import cache_root
    from tinycoder.progress import progress_dir_for
    from tinycoder.settings import variant_settings
    from tinycoder.snapshot import snapshot

    if not args.out:
        parser.error("snapshot needs --out DIR")
    if Path(args.out).exists():
        parser.error(f"--out {args.out} exists; give a new directory")
    progress = Path(args.progress_dir) if args.progress_dir else progress_dir_for(
        model_dir(args.variant, args.seed, args.cache_dir or cache_root()))
    if not (progress / "prepared").is_dir():
        parser.error(f"{progress} holds no build progress (a finished build removes it; keep copies for a curve)")
    try:
        manifest = snapshot(variant_settings(args.variant), args.seed, progress, Path(args.out),
                            Path(args.save) if args.save else None)
    except (ValueError, FileNotFoundError) as error:  # a save of another build, a missing file
        parser.error(str(error))
    print(json.dumps({k: manifest[k] for k in ("step", "steps", "tokens_trained", "epochs", "loss_last_20")}))
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
