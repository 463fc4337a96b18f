#!/usr/bin/env bash
# GPU check: on one CUDA GPU, in under 8 minutes, one table of
#   (a) our engine's pretrain of a small preset in bf16: tokens/s, MFU, and whether the Mamba-2
#       layers get mamba-ssm / causal-conv1d kernels (benchmarks/gpu_pretrain.py pretrain);
#   (b) Megatron-Bridge, when its environment imports megatron.bridge: a short mock-data pretrain
#       of its Nemotron 3 Nano 4B recipe under torchrun, tokens/s and MFU read from its log;
#   (c) a vLLM rollout batch's tokens/s, when vllm imports (benchmarks/gpu_pretrain.py vllm).
# A missing engine is a row saying "not installed", not a failure. Each part runs in its own
# process under a timeout, so one crash or hang leaves the others' rows.
#
#   bash benchmarks/gpu_check.sh
#
# Environment:
#   STAGEWISE_PYTHON     our python (default: .venv/bin/python of this checkout, else python3)
#   PRESET               our preset for (a) and (c) (default: small; `stagewise inspect --presets`)
#   MEGATRON_PYTHON      the python of Megatron-Bridge's own environment (default: STAGEWISE_PYTHON;
#                        in the NeMo container: python)
#   MEGATRON_BRIDGE_DIR  its source tree, for scripts/training/run_recipe.py (default /opt/Megatron-Bridge)
#   GPU_CHECK_DIR        where logs and rows go (default: a new temporary directory)
# Exit: 0 when the table was printed (rows may say failed), 2 when there is no GPU to check.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ -z "${STAGEWISE_PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then STAGEWISE_PYTHON="$ROOT/.venv/bin/python"; else STAGEWISE_PYTHON=python3; fi
fi
PY="$STAGEWISE_PYTHON"
PRESET="${PRESET:-small}"
MB_PY="${MEGATRON_PYTHON:-$PY}"
MB_DIR="${MEGATRON_BRIDGE_DIR:-/opt/Megatron-Bridge}"

no_gpu() {
  echo "gpu_check: $1. This check needs one NVIDIA GPU with CUDA; on a CPU machine run" \
       "benchmarks/train_throughput.py instead." >&2
  exit 2
}

command -v nvidia-smi >/dev/null 2>&1 || no_gpu "no NVIDIA driver here (nvidia-smi is not on PATH)"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi finds no GPU"
"$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null \
  || no_gpu "torch ($PY) sees no CUDA device (a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides the GPU)"

OUT="${GPU_CHECK_DIR:-$(mktemp -d -t gpu-check.XXXXXX)}"
mkdir -p "$OUT"
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
echo "gpu_check: $GPU_NAME; logs and rows in $OUT"

# Seconds for each part: 120 + 210 + 120 = 450 s, plus start-up, stays under 8 minutes.
PRETRAIN_S=120
MEGATRON_S=210
VLLM_S=120

# run_part STEM WHAT SECONDS cmd...: the command writes $OUT/STEM.json (its row), its output goes
# to $OUT/STEM.log; on a failure or a timeout a "failed" row says which, and where the log is.
run_part() {
  local stem="$1" what="$2" secs="$3"; shift 3
  local rc=0
  timeout --kill-after=10 "$secs" "$@" >"$OUT/$stem.log" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    local why="exit $rc"
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then why="timed out after ${secs} s"; fi
    "$PY" benchmarks/gpu_pretrain.py row --what "$what" --status failed --note "$why; log: $OUT/$stem.log" \
      --out "$OUT/$stem.json"
    tail -n 5 "$OUT/$stem.log" >&2 || true
  fi
}

# (a) ours
run_part pretrain "ours: pretrain ($PRESET)" "$PRETRAIN_S" \
  "$PY" benchmarks/gpu_pretrain.py pretrain --preset "$PRESET" --out "$OUT/pretrain.json"

# (b) Megatron-Bridge, in its own environment
MB_GB=8
MB_SL=2048
if "$MB_PY" -c "import megatron.bridge" >/dev/null 2>&1; then
  if [[ -f "$MB_DIR/scripts/training/run_recipe.py" ]]; then
    rc=0
    timeout --kill-after=10 "$MEGATRON_S" "$MB_PY" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=1 \
      "$MB_DIR/scripts/training/run_recipe.py" --recipe nemotron_3_nano_4b_pretrain_config --mode pretrain \
      --dataset mock -sl "$MB_SL" -gb "$MB_GB" -mb 1 -ms 12 -tp 1 -pp 1 -cp 1 -ep 1 \
      checkpoint.save=null logger.log_interval=1 >"$OUT/megatron.log" 2>&1 || rc=$?
    # the iterations logged before a timeout still give a rate
    "$PY" benchmarks/gpu_pretrain.py megatron-log "$OUT/megatron.log" --global-batch "$MB_GB" --seq-length "$MB_SL" \
      --gpu-name "$GPU_NAME" --out "$OUT/megatron.json"
    if [[ $rc -ne 0 ]] && ! grep -q '"status": "ok"' "$OUT/megatron.json"; then
      "$PY" benchmarks/gpu_pretrain.py row --what "Megatron-Bridge: pretrain" --status failed \
        --note "exit $rc; log: $OUT/megatron.log" --out "$OUT/megatron.json"
      tail -n 5 "$OUT/megatron.log" >&2 || true
    fi
  else
    "$PY" benchmarks/gpu_pretrain.py row --what "Megatron-Bridge: pretrain" --status skipped \
      --note "megatron.bridge imports but $MB_DIR/scripts/training/run_recipe.py is missing (set MEGATRON_BRIDGE_DIR)" \
      --out "$OUT/megatron.json"
  fi
else
  "$PY" benchmarks/gpu_pretrain.py row --what "Megatron-Bridge: pretrain" --status "not installed" \
    --note "$MB_PY cannot import megatron.bridge: use the NeMo container (MEGATRON_PYTHON=python there)" \
    --out "$OUT/megatron.json"
fi

# (c) vLLM (the row says "not installed" itself when vllm does not import)
run_part vllm "vLLM: rollout batch ($PRESET)" "$VLLM_S" \
  "$PY" benchmarks/gpu_pretrain.py vllm --preset "$PRESET" --out "$OUT/vllm.json"

"$PY" benchmarks/gpu_pretrain.py table "$OUT/pretrain.json" "$OUT/megatron.json" "$OUT/vllm.json" \
  --title "GPU check: $GPU_NAME"
