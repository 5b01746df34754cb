"""The model a run uses: the built-in tiny model or a local directory, resolved and checked before any actor starts.

Nothing is downloaded: ``model.path: tiny`` builds (or reads the shipped copy of) the tiny model, anything else must be
a directory holding a ``config.json``, weights and a tokenizer. Pure: no Ray (the driver and the calibration both
resolve the model this way).
"""

from __future__ import annotations

from pathlib import Path

from configs import Config

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


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
    ``progress``) or a local path holding a config.json, weights and a tokenizer; anything else is a
    ``SystemExit`` saying what is missing."""
    if config.model.path == "tiny":
        from tinycoder import ensure_model

        return str(ensure_model(variant=config.model.tiny_variant, seed=0, progress=progress))
    path = Path(config.model.path).expanduser()
    if config.model.path.startswith("${") or not (path / "config.json").is_file():
        raise SystemExit(
            f"error: model.path={config.model.path!r} is not a local model directory with a config.json "
            "(models are never downloaded; set POPULORA_MODEL or override model.path=/path/to/model)"
        )
    missing = [what for what, patterns in (("weights (*.safetensors or *.bin)", WEIGHT_FILES),
                                           ("a tokenizer (tokenizer.json or tokenizer_config.json)", TOKENIZER_FILES))
               if not any(any(path.glob(p)) for p in patterns)]
    if missing:
        raise SystemExit(
            f"error: the model directory {path} is incomplete: it has a config.json but no {' and no '.join(missing)} "
            "(copy the whole model directory, e.g. huggingface-cli download <model> --local-dir DIR on a machine online)"
        )
    return str(path)
