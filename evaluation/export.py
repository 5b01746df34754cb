"""Export one member of a run for use outside it: a PEFT adapter directory that names the real base model, a
card, optionally the adapter merged into a full Hugging Face model, and the line that serves it with vLLM.

    python -m evaluation.export RUN_DIR [--member best|ID] [--checkpoint N] [--out DIR] [--merge]

``--member best`` (the default) is the student (or single agent) with the highest conservative rating
``mu - k * sigma`` (``evolution.league.League.rating``) in the checkpoint; an id names any member. The checkpoint
is the latest complete one, or ``step-N`` (spelled as ``python -m evaluation`` spells it), and its files must
match its manifest (``checkpoints.checkpoint_problem``). The adapter is copied as written (float32 master
weights); its ``base_model_name_or_path`` is set to the run's base model (``planning.model_files.base_model_name``:
a Hugging Face id as configured, a local directory, or the tiny model's resolved directory), which fills it in for
checkpoints written before adapters named it (they named the learners' temporary copy in /dev/shm).
Nothing in the run directory is changed; the export goes to ``RUN_DIR/exports/<member>-step-<N>`` by default.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoints import checkpoint_problem
from evaluation.runs import RunDirError, checkpoint_dir, members, model_path, run_config
from evolution.league import League
from planning.model_files import base_model_name

SOLVER_ROLES = ("student", "agent")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class Standing:
    """One member of a checkpoint: its role, rating and lineage (its own record, then its ancestors')."""

    name: str
    role: str
    mu: float
    sigma: float
    conservative: float
    lineage: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Export:
    member: str
    step: int
    out: Path
    adapter: Path
    base: str
    rank: int
    merged: Path | None
    serve: str


def lineage_of(member: str, records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The lineage records of ``member`` and of every ancestor (breadth first; a founder has none)."""
    by_id = {r["id"]: r for r in records}
    out, queue, seen = [], [member], set()
    while queue:
        name = queue.pop(0)
        if name in seen or name not in by_id:
            continue
        seen.add(name)
        record = by_id[name]
        out.append({k: record[k] for k in ("id", "parents", "operator", "step") if k in record})
        queue.extend(record.get("parents", []))
    return tuple(out)


def standings(checkpoint: Path) -> dict[str, Standing]:
    """Every member of ``checkpoint`` with its role, TrueSkill rating and lineage (from ``league.json``; none in a
    checkpoint without one, whose members can still be exported by id)."""
    if not (checkpoint / "league.json").is_file():
        return {}
    state = json.loads((checkpoint / "league.json").read_text())
    league = League.from_state_dict(state["league"])
    records = (state.get("policy") or {}).get("lineage", [])
    out = {}
    for name, rating in league.ratings().items():
        out[name] = Standing(name, state["roles"].get(name, "?"), rating.mu, rating.sigma, rating.conservative,
                             lineage_of(name, records))
    return out


def choose_member(requested: str, table: dict[str, Standing], have: list[str]) -> str:
    """``requested`` itself when the checkpoint holds its adapter, or for ``best`` the solver (student or single
    agent; any member in a run without one) with the highest conservative rating."""
    if requested != "best":
        if requested not in have:
            raise RunDirError(f"no member {requested!r} in this checkpoint; it holds: {', '.join(have)}")
        return requested
    pool = [s for s in table.values() if s.name in have and s.role in SOLVER_ROLES] or \
        [s for s in table.values() if s.name in have]
    if not pool:
        raise RunDirError(f"no rated member has an adapter in this checkpoint (no league.json?): name one with --member "
                          f"(it holds: {', '.join(have)})")
    return max(pool, key=lambda s: (s.conservative, s.name)).name


def serving_line(base: str, name: str, adapter: Path, rank: int) -> str:
    """``vllm serve`` with this adapter as a LoRA module (``--max-lora-rank`` covers its rank)."""
    allowed = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank choices
    max_rank = next((r for r in allowed if r >= rank), rank)
    return (f"vllm serve {shlex.quote(base)} --enable-lora --lora-modules {shlex.quote(f'{name}={adapter}')} "
            f"--max-lora-rank {max_rank}")


def card(standing: Standing | None, member: str, step: int, base: str, run_dir: Path, serve: str, merged: bool) -> str:
    lines = [f"# {member} (step {step})", "", f"A LoRA adapter trained by PopuLoRA self-play in `{run_dir}`.", "",
             f"- base model: `{base}`", f"- checkpoint: step {step}"]
    if standing is not None:
        lines += [f"- role: {standing.role}",
                  f"- TrueSkill: mu {standing.mu:.3f}, sigma {standing.sigma:.3f}, conservative {standing.conservative:.3f}"]
        if standing.lineage:
            lines.append("- lineage: " + "; ".join(
                f"{r['id']} <- {' + '.join(r.get('parents', [])) or '?'} ({r.get('operator', '?')}, step {r.get('step', '?')})"
                for r in standing.lineage))
        else:
            lines.append("- lineage: a founding member (no evolution event made it)")
    lines += ["", "Serve it:", "", "```", serve, "```", "",
              "Load it with PEFT:", "", "```python",
              "from peft import AutoPeftModelForCausalLM",
              "model = AutoPeftModelForCausalLM.from_pretrained(\"adapter\")",
              "```"]
    if merged:
        lines += ["", "`merged/` holds the adapter merged into the base, a full Hugging Face model (`vllm serve merged`)."]
    return "\n".join(lines) + "\n"


def merge(adapter: Path, model_dir: Path, out: Path, dtype: str) -> Path:
    """The base at ``model_dir`` with ``adapter`` merged in (W + B A * alpha / r), saved as a full model with its
    tokenizer under ``out``. Merged on the CPU in the run's ``model.dtype``: a 7B base in bfloat16 needs ~15 GB of
    host memory and no GPU."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    give_umask_modes(out)
    return out


def give_umask_modes(root: Path) -> None:
    """Give every file under ``root`` the mode the user's umask gives a new file (0o666 less it): safetensors (0.8)
    writes its files 0o600 whatever the umask, which would keep a merged model from the group a user shares it with."""
    umask = os.umask(0)
    os.umask(umask)
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def export_member(run_dir: Path, member: str = "best", step: int | None = None, out: Path | None = None,
                  do_merge: bool = False) -> Export:
    """Write ``member`` of ``run_dir``'s checkpoint (``step``, default the latest) under ``out``: ``adapter/``
    (PEFT), ``README.md`` (the card) and with ``do_merge`` ``merged/``. Refuses a checkpoint whose files do not
    match its manifest, an unknown member and an ``out`` that exists and is not empty."""
    run_dir = Path(run_dir)
    config = run_config(run_dir)
    checkpoint = checkpoint_dir(run_dir, step)
    problem = checkpoint_problem(checkpoint)
    if problem:
        raise RunDirError(f"{checkpoint} cannot be exported: {problem}")
    step = int(checkpoint.name.split("-")[1])
    found = {m.name: m for m in members(checkpoint)}
    table = standings(checkpoint)
    name = choose_member(member, table, sorted(found))
    out = Path(out) if out is not None else run_dir / "exports" / f"{name}-step-{step}"
    if out.exists() and any(out.iterdir()):
        raise RunDirError(f"{out} exists and is not empty; name another --out")
    model_dir = model_path(config)
    base = base_model_name(config, str(model_dir))
    adapter = out / "adapter"
    adapter.mkdir(parents=True)
    for file in ADAPTER_FILES:  # the contents only: new files, with the mode the user's umask gives
        shutil.copyfile(found[name].path / file, adapter / file)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = base
    (adapter / "adapter_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True))
    merged = merge(adapter, model_dir, out / "merged", config.model.dtype) if do_merge else None
    serve = serving_line(base, name, adapter.resolve(), found[name].rank)
    (out / "README.md").write_text(card(table.get(name), name, step, base, run_dir.resolve(), serve, merged is not None))
    return Export(name, step, out, adapter, base, found[name].rank, merged, serve)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory")
    parser.add_argument("--member", default="best", help="a member id, or 'best' (default): the strongest solver")
    parser.add_argument("--checkpoint", type=int, default=None, metavar="N", help="checkpoint step-N (default: the latest)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: RUN_DIR/exports/<member>-step-<N>)")
    parser.add_argument("--merge", action="store_true", help="also merge the adapter into a full model (out/merged)")
    args = parser.parse_args(argv)
    try:
        done = export_member(args.run_dir, args.member, args.checkpoint, args.out, args.merge)
    except RunDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"exported {done.member} (step {done.step}) -> {done.adapter} (base {done.base})")
    if done.merged is not None:
        print(f"merged model -> {done.merged} (serve it with: vllm serve {shlex.quote(str(done.merged.resolve()))})")
    print(f"serve: {done.serve}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
