"""Task sets from the tiny model's program generator, for measuring students: held-out probes that leave out every
program a model's build drafted (:func:`probe_tasks`), and tasks of the programs it trained on (:func:`seen_tasks`).
Their outputs are computed by the verifier; nothing is evaluated on the host."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tinycoder.cache import MANIFEST
from tinycoder.corpus import CorpusSettings, build_corpus, corpus_settings_from_dict, draw_programs, verify_programs
from tinycoder.examples import f_task, io_task
from tinycoder.programs import Program
from tinycoder.settings import variant_settings
from verifier.buffers import load_seed_file
from verifier.sandbox import Verifier

PROBE_SEED = 7_777_777


def generator_tasks(verifier: Verifier, count: int, n_inputs: int, seed: int, exclude: set[str], oversample: int = 3) -> list:
    """``count`` tasks, families in rotation, from the tiny model's program generator with ``seed``,
    leaving out the programs in ``exclude`` (``oversample * count`` programs are drawn, doubled while too few are left)."""
    while True:
        settings = CorpusSettings(programs=count * oversample, inputs_per_program=n_inputs, min_inputs=n_inputs)
        corpus = [item for item in build_corpus(verifier, settings, seed) if item.program.source not in exclude]
        if len(corpus) >= count or oversample >= 48:
            break
        oversample *= 2
    return tasks_from(corpus, count, n_inputs, seed)


def tasks_from(corpus: list, count: int, n_inputs: int, seed: int) -> list:
    """``count`` tasks of shuffled ``corpus`` programs (``random.Random(seed)``), families in rotation."""
    corpus = list(corpus)
    random.Random(seed).shuffle(corpus)
    families = ("code_o", "code_i", "code_f")
    tasks = []
    for i, item in enumerate(corpus[:count]):
        family = families[i % 3]
        tasks.append(f_task(item, n_inputs) if family == "code_f" else io_task(family, item))
    return tasks


PROBE_SET = "heldout-v2"
"""Names the probe set's rule in cache keys (``studies.dynamics``): v2 leaves out every program the model's build
drafted. v1 (before the build's drafts were known) left out only the model's seed tasks: 7 of its 120 probe programs were drafts of the
default's build, 21 of the ``stronger-large`` build's, so a bigger corpus would have been scored partly on its
training programs."""


def build_drafts(model_dir: Path) -> tuple[CorpusSettings, list[tuple[Program, list[str]]]] | None:
    """The corpus settings of the build of ``model_dir`` and every program it drafted with the inputs drafted for it,
    kept or not (``tinycoder.corpus.build_corpus`` draws them with ``random.Random(seed)``; its manifest, or a training
    save's snapshot, records both): a few seconds for 40,000 drafts, no sandbox. None without a manifest."""
    manifest = Path(model_dir) / MANIFEST
    if not manifest.is_file():
        return None
    built = json.loads(manifest.read_text())
    settings = corpus_settings_from_dict(built["settings"]["corpus"])
    return settings, draw_programs(settings, random.Random(built["seed"]))


def trained_programs(model_dir: Path) -> set[str]:
    """The programs the build of ``model_dir`` drafted (:func:`build_drafts`), those of every build it continues (its
    manifest's ``continues``, followed through ``VARIANTS``), and its seed tasks: none is held out."""
    seen = {t.program for t in load_seed_file(model_dir / "tasks.jsonl")} if (model_dir / "tasks.jsonl").is_file() else set()
    built = build_drafts(model_dir)
    if built is None:
        return seen
    seen |= {program.source for program, _ in built[1]}
    manifest = json.loads((Path(model_dir) / MANIFEST).read_text())
    parent = (manifest.get("continues") or {}).get("variant")
    while parent is not None:
        settings = variant_settings(parent)
        seen |= {program.source for program, _ in draw_programs(settings.corpus, random.Random(manifest["seed"]))}
        parent = settings.continues
    return seen


SEEN_SEED = 5_555_555


def seen_tasks(model_dir: Path, count: int, n_inputs: int, verifier: Verifier) -> list:
    """``count`` tasks of programs the model's build drafted, with the inputs drafted for its training (those the
    sandbox keeps; :func:`build_drafts`): the training distribution, beside the held-out probes. A model that fits its
    corpus solves these about as often as its examples were right; a gap to the held-out probes is what it memorised
    rather than learned."""
    built = build_drafts(model_dir)
    if built is None:
        raise ValueError(f"{model_dir} has no {MANIFEST}: which programs its build drafted is unknown")
    settings, drafts = built
    rng = random.Random(SEEN_SEED)
    chosen = rng.sample(drafts, min(len(drafts), 3 * count))
    kept = [item for item in verify_programs(verifier, chosen, settings, rng) if len(item.inputs) >= n_inputs]
    return tasks_from(kept, count, n_inputs, SEEN_SEED)


def probe_tasks(model_dir: Path, count: int, n_inputs: int, verifier: Verifier) -> list:
    """``count`` held-out tasks from a generator seed no build uses, none of them a program the model's build drafted
    or one of its seed tasks (:func:`trained_programs`)."""
    return generator_tasks(verifier, count, n_inputs, PROBE_SEED, trained_programs(Path(model_dir)))
