"""The model a run uses: the built-in tiny model, a local directory or a Hugging Face id from the local cache,
resolved and checked before any actor starts.

Nothing is downloaded: ``model.path: tiny`` builds (or reads the shipped copy of) the tiny model; a Hub id such as
``Qwen/Qwen2.5-7B`` is the snapshot directory of the local Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; its ``refs/main``), read with ``huggingface_hub``'s cache-only
lookup; anything else must be a directory holding a ``config.json``, weights and a tokenizer. A local directory of
the same name wins over the cache. Pure: no Ray (the driver, the plan and the calibration all resolve the model
this way).
"""

from __future__ import annotations

import re
from pathlib import Path

from configs import Config
from configs.model_dir import model_dir_argument  # noqa: F401  (the commands' model options import it from here too)

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""``org/name``: how the Hugging Face Hub names a model (and how a relative two-part path may look)."""


class ModelPathError(ValueError):
    """``model.path`` names no model this machine has; the message says what to do."""


def is_hub_id(path: str) -> bool:
    """Whether ``path`` has the form of a Hub model id (``org/name``; no ``..``)."""
    return bool(HUB_ID.match(path)) and ".." not in path


def hub_download_command(repo_id: str) -> str:
    """The command that puts ``repo_id`` into the local Hugging Face cache (huggingface_hub's ``hf`` CLI)."""
    return f"hf download {repo_id}"


def cached_snapshot(repo_id: str) -> Path | None:
    """The snapshot directory of ``repo_id`` at ``refs/main`` in the local Hugging Face cache, when its
    ``config.json`` is there; None otherwise. Reads the cache only (``try_to_load_from_cache``: no network)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def model_directory(path: str) -> Path:
    """The directory ``model.path`` names (not ``tiny``): a local path (``~`` expanded) where one exists, else for a
    Hub id its cached snapshot (``cached_snapshot``), else the path as written (the callers say what it lacks). A
    Hub id with no cached copy raises ``ModelPathError`` naming the download command."""
    local = Path(path).expanduser()
    if local.exists() or path.startswith("${") or not is_hub_id(path):
        return local
    snapshot = cached_snapshot(path)
    if snapshot is None:
        from huggingface_hub import constants

        raise ModelPathError(
            f"model.path={path} is neither a local directory nor a model in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); models are never downloaded at run time: download it first with "
            f"`{hub_download_command(path)}` (set HF_HOME or HF_HUB_CACHE where the cache is elsewhere), "
            "or set model.path to a local model directory")
    return snapshot


def base_model_name(config: Config, model_dir: str) -> str:
    """What an adapter names as its base (``base_model_name_or_path``), so that it loads outside the run: a
    Hugging Face id as configured, a local directory as an absolute path, the tiny model as its resolved
    directory ``model_dir`` (never the learners' temporary shared copy in /dev/shm)."""
    configured = config.model.path
    if configured == "tiny":
        return str(Path(model_dir).resolve())
    local = Path(configured).expanduser()
    return str(local.resolve()) if local.is_dir() else configured


def resolve_model(config: Config, progress: bool = True) -> str:
    """The model directory: the built-in tiny model (built and cached on first use, showing its progress when
    ``progress``), or the directory ``model_directory`` finds (a local path, a Hub id's cached snapshot) holding a
    config.json, weights and a tokenizer; anything else is a ``SystemExit`` saying what is missing."""
    if config.model.path == "tiny":
        from tinycoder import ensure_model

        return str(ensure_model(variant=config.model.tiny_variant, seed=0, progress=progress))
    try:
        path = model_directory(config.model.path)
    except ModelPathError as err:
        raise SystemExit(f"error: {err}") from None
    if config.model.path.startswith("${") or not (path / "config.json").is_file():
        raise SystemExit(
            f"error: model.path={config.model.path!r} is not a local model directory with a config.json "
            "(models are never downloaded; set POPULORA_MODEL or override model.path=/path/to/model or a Hugging Face "
            "id in the local cache)"
        )
    missing = [what for what, patterns in (("weights (*.safetensors or *.bin)", WEIGHT_FILES),
                                           ("a tokenizer (tokenizer.json or tokenizer_config.json)", TOKENIZER_FILES))
               if not any(any(path.glob(p)) for p in patterns)]
    if missing:
        raise SystemExit(
            f"error: the model directory {path} is incomplete: it has a config.json but no {' and no '.join(missing)} "
            + (f"(a partial copy in the Hugging Face cache: complete it with `{hub_download_command(config.model.path)}`)"
               if path != Path(config.model.path).expanduser() else
               f"(copy the whole model directory, e.g. `{hub_download_command('<model>')} --local-dir DIR` on a machine online)")
        )
    return str(path)
