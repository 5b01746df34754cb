"""A build's saved progress, so that an interrupted build resumes where it stopped.

A cached build (``tinycoder.build_here``) keeps its progress in ``<cache root>/<variant>-<key>.progress/``, beside
the cache entry and written only under its lock (``tinycoder.cache.build_once``). Stages, each written atomically
(a temporary file or directory renamed into place, so a kill at any moment leaves the previous save whole):

- ``key.json``: the cache key and what it hashes (``tinycoder.settings.describe``); a save of another key is never
  used (one line says so) and is cleared.
- ``corpus.partial.jsonl``: while the corpus is verified, after each chunk of drafts (``SavePolicy.corpus_chunk``):
  a header line (drafts done, the state of the generator that decides on constant programs), then the programs
  kept so far (``tinycoder.corpus.PartialCorpus``).
- ``corpus.jsonl``: the verified corpus (``VerifiedProgram.to_dict`` per line), once generated.
- ``prepared/``: the tokenizer's files as the build wrote them, and ``data.pt``, the encoded training examples.
- ``train.pt``: a :class:`tinycoder.train.TrainState`: model and AdamW state dicts, the step (the learning-rate
  schedule is a function of it), the losses so far, the data order (Python RNG state and the epoch's batches still
  to train), torch's RNG state, the torch thread count. Read with ``torch.load(weights_only=True)``.

:meth:`BuildProgress.open` decides once, before the build starts, how far a save carries it, and returns the one line
that says so: ``resuming build <key> from step N of M (...)`` or ``starting build <key> from scratch (no usable save:
<why>)``; files of later stages than the one resumed from are removed first, so a later stage always belongs to the
earlier ones beside it. A resumed build equals an uninterrupted one bit for bit when both use one torch thread count
(CPU matmuls split work by thread); a different count is said in the same line.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tinycoder.corpus import PartialCorpus, VerifiedProgram
from tinycoder.train import Encoded, TrainState

KEY_FILE = "key.json"
CORPUS_FILE = "corpus.jsonl"
PARTIAL_CORPUS_FILE = "corpus.partial.jsonl"
PREPARED_DIR = "prepared"
DATA_FILE = "data.pt"
TRAIN_FILE = "train.pt"
PROGRESS_SUFFIX = ".progress"


def progress_dir_for(target: Path) -> Path:
    """The progress directory of the cache entry ``target`` (``<variant>-<key>`` -> ``<variant>-<key>.progress``)."""
    return target.with_name(target.name + PROGRESS_SUFFIX)


@dataclass
class Resume:
    """What :meth:`BuildProgress.open` found usable: the corpus, the prepared directory (tokenizer files) with the
    encoded examples read from its ``data.pt``, the training state, each None when the build must make it; ``line``
    says which. ``partial``: where the corpus's verification stopped, when the whole corpus was not saved yet."""

    corpus: list[VerifiedProgram] | None
    prepared: Path | None
    data: list[Encoded] | None
    train: TrainState | None
    line: str
    partial: PartialCorpus | None = None

    @property
    def step(self) -> int:
        return self.train.step if self.train is not None else 0


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` a file beside ``path``, flush it to disk, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def encoded_to_tensors(data: Sequence[Encoded]) -> dict[str, torch.Tensor]:
    """The encoded examples as three tensors (all ids concatenated, each example's length and prompt length)."""
    lengths = torch.tensor([len(d.ids) for d in data], dtype=torch.int64)
    ids = torch.tensor([i for d in data for i in d.ids], dtype=torch.int32)
    return {"ids": ids, "lengths": lengths, "prompt_lens": torch.tensor([d.prompt_len for d in data], dtype=torch.int64)}


def encoded_from_tensors(saved: dict[str, torch.Tensor]) -> list[Encoded]:
    """The inverse of :func:`encoded_to_tensors`."""
    ids, lengths, prompt_lens = saved["ids"].tolist(), saved["lengths"].tolist(), saved["prompt_lens"].tolist()
    if sum(lengths) != len(ids) or len(lengths) != len(prompt_lens):
        raise ValueError(f"{len(ids)} ids do not split into {len(lengths)} examples")
    out, at = [], 0
    for n, p in zip(lengths, prompt_lens):
        out.append(Encoded(ids[at:at + n], p))
        at += n
    return out


class BuildProgress:
    """The progress directory of one build (module docstring). ``key``: the cache key; ``description``: what it
    hashes (recorded beside it, for a reader)."""

    def __init__(self, directory: Path, key: str, description: dict[str, Any]):
        self.directory = Path(directory)
        self.key = key
        self.description = description

    # ------------------------------------------------------------------ reading
    def open(self, steps: int, threads: int) -> Resume:
        """Decide how far the saves carry a build of ``steps`` training steps on ``threads`` torch threads; clear
        what is unusable and prepare the directory for this build's saves."""
        d = self.directory
        if not d.is_dir():
            return self._scratch("none yet")
        try:
            saved_key = json.loads((d / KEY_FILE).read_text())["key"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            return self._scratch(f"{d} has no readable {KEY_FILE} ({type(error).__name__})")
        if saved_key != self.key:
            return self._scratch(f"the save in {d} is of build {saved_key}, not {self.key} (other settings, seed, "
                                 f"generator or prompt formats); not used")
        for leftover in d.glob(".*.tmp-*"):  # a save a kill interrupted: never renamed into place
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        if not (d / CORPUS_FILE).is_file():
            self._clear(TRAIN_FILE, PREPARED_DIR)
            if not (d / PARTIAL_CORPUS_FILE).is_file():
                return self._scratch("the last build stopped before its corpus was saved")
            try:
                partial = self.load_partial_corpus()
            except Exception as error:
                return self._scratch(f"{d / PARTIAL_CORPUS_FILE} is unreadable ({_why(error)})")
            return Resume(None, None, None, None, self._resuming(
                0, steps, f"the corpus is verified up to program {partial.drafts_done} of those drawn, "
                          f"{len(partial.kept)} kept"), partial=partial)
        self._clear(PARTIAL_CORPUS_FILE)
        try:
            corpus = self.load_corpus()
        except (OSError, ValueError, KeyError, TypeError) as error:
            return self._scratch(f"{d / CORPUS_FILE} is unreadable ({type(error).__name__}: {error})")
        if not (d / PREPARED_DIR / DATA_FILE).is_file():
            self._clear(TRAIN_FILE, PREPARED_DIR)
            return Resume(corpus, None, None, None, self._resuming(0, steps, "the saved corpus; the examples were not saved yet"))
        try:
            data = self.load_data()
        except Exception as error:  # any failure to read it back (truncated, foreign, damaged) means: not usable
            self._clear(TRAIN_FILE, PREPARED_DIR)
            return Resume(corpus, None, None, None, self._resuming(
                0, steps, f"the saved corpus; the saved examples are unusable: {_why(error)}"))
        prepared = d / PREPARED_DIR
        if not (d / TRAIN_FILE).is_file():
            return Resume(corpus, prepared, data, None,
                          self._resuming(0, steps, "the saved corpus and examples; no training save yet"))
        try:
            state = self.load_train()
            if not 0 <= state.step <= steps:
                raise ValueError(f"it is at step {state.step} of a {steps}-step build")
            if any(not 0 <= i < len(data) for batch in state.queue for i in batch):
                raise ValueError("its data order indexes examples the saved data do not have")
        except Exception as error:
            self._clear(TRAIN_FILE)
            return Resume(corpus, prepared, data, None, self._resuming(
                0, steps, f"the saved corpus and examples; the training save is unusable: {_why(error)}"))
        note = f"saved in {d}"
        if state.threads != threads:
            note += (f"; saved with {state.threads} torch thread(s), continued with {threads}: the last bits will "
                     f"differ from an uninterrupted build")
        return Resume(corpus, prepared, data, state, self._resuming(state.step, steps, note))

    def load_corpus(self) -> list[VerifiedProgram]:
        with (self.directory / CORPUS_FILE).open() as handle:
            corpus = [VerifiedProgram.from_dict(json.loads(line)) for line in handle]
        if not corpus:
            raise ValueError("no programs")
        return corpus

    def load_partial_corpus(self) -> PartialCorpus:
        with (self.directory / PARTIAL_CORPUS_FILE).open() as handle:
            head = json.loads(handle.readline())
            kept = tuple(VerifiedProgram.from_dict(json.loads(line)) for line in handle)
        if len(kept) != head["kept"]:
            raise ValueError(f"{len(kept)} programs where the header says {head['kept']}")
        version, internal, gauss = head["rng_state"]
        return PartialCorpus(head["drafts_done"], kept, (version, tuple(internal), gauss))

    def load_data(self) -> list[Encoded]:
        return encoded_from_tensors(torch.load(self.directory / PREPARED_DIR / DATA_FILE, weights_only=True))

    def load_train(self, path: Path | None = None) -> TrainState:
        """The training save (``path``: a copy of one, default this directory's ``train.pt``), if it is this build's."""
        saved = torch.load(path or self.directory / TRAIN_FILE, weights_only=True)
        if saved.get("key") != self.key:
            raise ValueError(f"it is of build {saved.get('key')}, not {self.key}")
        return TrainState(**{k: v for k, v in saved.items() if k != "key"})

    def restore_prepared(self, out_dir: Path) -> Any:
        """Copy the saved tokenizer files (and ``config.json``) into ``out_dir``; returns the tokenizer read from
        there (what ``tinycoder.tokenizer.reload`` checked when the build saved them)."""
        from transformers import AutoTokenizer

        for path in (self.directory / PREPARED_DIR).iterdir():
            if path.name != DATA_FILE:
                shutil.copyfile(path, Path(out_dir) / path.name)
        return AutoTokenizer.from_pretrained(out_dir)

    # ------------------------------------------------------------------ writing
    def save_corpus(self, corpus: Sequence[VerifiedProgram]) -> None:
        _write_atomically(self.directory / CORPUS_FILE, lambda tmp: _write_programs(tmp, corpus))
        self._clear(PARTIAL_CORPUS_FILE)

    def save_partial_corpus(self, partial: PartialCorpus) -> None:
        head = {"drafts_done": partial.drafts_done, "kept": len(partial.kept), "rng_state": partial.rng_state}
        _write_atomically(self.directory / PARTIAL_CORPUS_FILE, lambda tmp: _write_programs(tmp, partial.kept, head))

    def save_prepared(self, files_from: Path, names: Sequence[str], data: Sequence[Encoded]) -> None:
        """``names`` from the directory ``files_from`` (the tokenizer's files) and the encoded ``data``."""
        tmp = self.directory / f".{PREPARED_DIR}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in names:
            shutil.copyfile(files_from / name, tmp / name)
        torch.save(encoded_to_tensors(data), tmp / DATA_FILE)
        for path in tmp.iterdir():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
        shutil.rmtree(self.directory / PREPARED_DIR, ignore_errors=True)
        os.rename(tmp, self.directory / PREPARED_DIR)
        _fsync_dir(self.directory)

    def save_train(self, state: TrainState) -> None:
        _write_atomically(self.directory / TRAIN_FILE,
                          lambda tmp: torch.save({"key": self.key, **asdict_shallow(state)}, tmp))

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def _scratch(self, why: str) -> Resume:
        """Clear the directory and record this build's key in it; the line says why nothing is used."""
        self.remove()
        self.directory.mkdir(parents=True)
        _write_atomically(self.directory / KEY_FILE,
                          lambda tmp: tmp.write_text(json.dumps({"key": self.key, "describes": self.description},
                                                                indent=1, default=str)))
        return Resume(None, None, None, None, f"starting build {self.key} from scratch (no usable save: {why})")

    def _resuming(self, step: int, steps: int, note: str) -> str:
        return f"resuming build {self.key} from step {step} of {steps} ({note})"

    def _clear(self, *names: str) -> None:
        for name in names:
            path = self.directory / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _write_programs(path: Path, programs: Sequence[VerifiedProgram], head: dict[str, Any] | None = None) -> None:
    """One JSON line per program, after ``head``'s line when given."""
    with path.open("w") as handle:
        if head is not None:
            handle.write(json.dumps(head) + "\n")
        for item in programs:
            handle.write(json.dumps(item.to_dict()) + "\n")


def _why(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:200]}"


def asdict_shallow(state: TrainState) -> dict[str, Any]:
    """The fields of ``state`` as a dict, values untouched (``dataclasses.asdict`` would deep-copy the tensors)."""
    return {name: getattr(state, name) for name in TrainState.__dataclass_fields__}
