#!/usr/bin/env bash
# GPU check: what the first minutes on one bare CUDA GPU should answer, in one command under 8 minutes,
# one table (benchmarks/gpu_check.py holds the parts; each runs in its own process under its own timeout):
#   - our engine's pretraining step on the `small` preset in bf16, tokens/s and MFU, with the Mamba-2
#     layers on mamba-ssm's Triton kernels and on our PyTorch scan, side by side; peak GPU memory
#     against `stagewise inspect`'s estimate;
#   - one packed SFT step, and one RL rollout + GRPO step, on the same preset;
#   - AutoQuantize on a briefly trained tiny model with modelopt's GPU kernels against our CPU
#     emulation: effective bits and loss delta of each;
#   - Megatron-Bridge and vLLM where they import (the wheelhouse carries neither: a row says so).
# A part that cannot run or fails is a row saying why, never the end of the check.
#
#   bash benchmarks/gpu_check.sh             # on the GPU machine, from the working tree (+ .whl/)
#   bash benchmarks/gpu_check.sh --dry-run   # on a CPU machine: what would run, each part rehearsed
#                                            # at toy size on the CPU, the wheelhouse checked
#
# On a bare GPU machine (its image's python3 with CUDA PyTorch; nothing reachable) the wheels of
# `python3 dev.py gpu-wheelhouse` (.whl/, carried) go into a --target folder put first on PYTHONPATH;
# this checkout's stagewise/ is imported from the tree. docs/STACK.md ("The first GPU minutes") has the
# exact call.
#
# Environment:
#   STAGEWISE_PYTHON     the python (default: .venv/bin/python of this checkout, else python3)
#   PRESET               the preset of the pretrain, SFT, RL and vLLM parts (default: small)
#   GPU_CHECK_DIR        where logs and rows go (default: a new temporary directory)
#   GPU_CHECK_BUDGET_S   the whole check's seconds (default 470: parts that would not fit are skipped)
#   OUT                  when set, gpu_check.json (the rows), gpu_check.txt (the table) and
#                        gpu_check.log (every part's log) are written there too
#   MEGATRON_PYTHON, MEGATRON_BRIDGE_DIR   Megatron-Bridge's own python and source tree (its part runs
#                        only where that python imports megatron.bridge, e.g. in the NeMo container)
# Exit: 0 when the table was printed (rows may say failed); 2 when there is no GPU to check (or bad
# arguments); with --dry-run, 1 when a rehearsal failed or the wheelhouse does not cover the imports.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "gpu_check: unknown argument $1 (--dry-run or nothing; --help)" >&2; exit 2 ;;
esac

if [[ -z "${STAGEWISE_PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then STAGEWISE_PYTHON="$ROOT/.venv/bin/python"; else STAGEWISE_PYTHON=python3; fi
fi
PY="$STAGEWISE_PYTHON"
PRESET="${PRESET:-small}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"
MB_PY="${MEGATRON_PYTHON:-$PY}"
MB_DIR="${MEGATRON_BRIDGE_DIR:-/opt/Megatron-Bridge}"
CHECK="benchmarks/gpu_check.py"

# stem | seconds | arguments of benchmarks/gpu_check.py (the part's name first)
PARTS=(
  "pretrain-kernels|120|pretrain --mamba kernels --preset $PRESET"
  "pretrain-torch|75|pretrain --mamba torch --preset $PRESET"
  "sft|60|sft --preset $PRESET"
  "rl|60|rl --preset $PRESET"
  "quant|120|quant"
  "vllm|60|vllm --preset $PRESET"
)
MEGATRON_S=210
WHEELS=(.whl/*.whl)
[[ -e "${WHEELS[0]}" ]] || WHEELS=()

if [[ $DRY_RUN -eq 1 ]]; then
  echo "gpu_check --dry-run: on a GPU machine this would run, each part in its own process, within ${BUDGET_S} s:"
  for part in "${PARTS[@]}"; do
    IFS='|' read -r stem secs args <<<"$part"
    printf '  %-17s %4s s  python %s %s --out ROW.json\n' "$stem" "$secs" "$CHECK" "$args"
  done
  printf '  %-17s %4s s  %s\n' "megatron" "$MEGATRON_S" \
    "torchrun run_recipe.py nemotron_3_nano_4b_pretrain_config (only where MEGATRON_PYTHON imports megatron.bridge)"
  if [[ ${#WHEELS[@]} -eq 0 ]]; then
    echo "gpu_check: no wheelhouse in .whl/ (python3 dev.py gpu-wheelhouse makes it; a bare GPU machine needs it)"
  else
    key=$(python3 -c 'import dev; print(dev.gpu_wheels_key())')
    if [[ "$(cat .whl/.stagewise-gpu-wheels 2>/dev/null)" != "$key" ]]; then
      echo "gpu_check: .whl/ was made from other pins than dev.py's GPU_WHEELS: run python3 dev.py gpu-wheelhouse" >&2
      exit 1
    fi
    site="$(mktemp -d -t gpu-check-site.XXXXXX)"
    # what the GPU machine's pip will do, for its Python 3.12 on x86-64 Linux
    if ! "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$site" \
         --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
         --only-binary=:all: "${WHEELS[@]}" >"$site.log" 2>&1; then
      echo "gpu_check: the wheelhouse does not install for CPython 3.12 on x86-64 Linux:" >&2
      tail -n 20 "$site.log" >&2
      exit 1
    fi
    echo "gpu_check: the wheelhouse (${#WHEELS[@]} wheels, $(du -sh .whl | cut -f1)) installs for CPython 3.12 on x86-64"
    rm -rf "$site" "$site.log"
  fi
  DIR="${GPU_CHECK_DIR:-$(mktemp -d -t gpu-check-dry.XXXXXX)}"
  mkdir -p "$DIR"
  echo "gpu_check: rehearsing each part on the CPU at toy size (logs in $DIR)"
  failed=0
  rows=()
  for part in "${PARTS[@]}"; do
    IFS='|' read -r stem secs args <<<"$part"
    [[ "$stem" == "pretrain-torch" ]] && continue  # on a CPU both pretrain rows run our scan: one rehearsal
    rc=0
    # shellcheck disable=SC2086  # $args is our own word list
    timeout --kill-after=10 300 "$PY" "$CHECK" $args --device cpu --out "$DIR/$stem.json" \
      --imports-out "$DIR/$stem.imports.json" >"$DIR/$stem.log" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "gpu_check: the $stem rehearsal failed (exit $rc):" >&2
      tail -n 15 "$DIR/$stem.log" >&2
      failed=1
    fi
    rows+=("$DIR/$stem.json")
  done
  "$PY" "$CHECK" table "${rows[@]}" --title "GPU check rehearsal (CPU, toy sizes: rates mean nothing)"
  "$PY" "$CHECK" covers "$DIR"/*.imports.json || failed=1
  exit $failed
fi

no_gpu() {
  echo "gpu_check: $1. This check needs one NVIDIA GPU with CUDA; on a CPU machine run" \
       "bash benchmarks/gpu_check.sh --dry-run, or benchmarks/train_throughput.py." >&2
  exit 2
}

command -v nvidia-smi >/dev/null 2>&1 || no_gpu "no NVIDIA driver here (nvidia-smi is not on PATH)"
nvidia-smi -L >/dev/null 2>&1 || no_gpu "nvidia-smi finds no GPU"

# the image's torch (the wheelhouse carries none), before anything is installed
"$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null \
  || no_gpu "torch ($PY) sees no CUDA device (a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides the GPU)"

DIR="${GPU_CHECK_DIR:-$(mktemp -d -t gpu-check.XXXXXX)}"
mkdir -p "$DIR"
if [[ ${#WHEELS[@]} -gt 0 ]]; then
  SITE="$DIR/site"
  echo "gpu_check: installing the wheelhouse (${#WHEELS[@]} wheels) into $SITE"
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --target "$SITE" \
    "${WHEELS[@]}" >"$DIR/wheelhouse.log" 2>&1 || { tail -n 20 "$DIR/wheelhouse.log" >&2; no_gpu "the wheelhouse did not install"; }
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
echo "gpu_check: $GPU_NAME; logs and rows in $DIR"
export PYTHONUNBUFFERED=1
START=$SECONDS

# row STEM WHAT STATUS NOTE: a row the part itself could not write
row() {
  "$PY" "$CHECK" row --what "$2" --status "$3" --note "$4" --out "$DIR/$1.json"
}

ROWS=()
for part in "${PARTS[@]}"; do
  IFS='|' read -r stem secs args <<<"$part"
  ROWS+=("$DIR/$stem.json")
  left=$((BUDGET_S - (SECONDS - START)))
  if [[ $left -lt 20 ]]; then
    row "$stem" "$stem" skipped "out of the check's ${BUDGET_S} s"
    continue
  fi
  [[ $secs -gt $left ]] && secs=$left
  rc=0
  # shellcheck disable=SC2086  # $args is our own word list
  timeout --kill-after=10 "$secs" "$PY" "$CHECK" $args --out "$DIR/$stem.json" >"$DIR/$stem.log" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then
    why="exit $rc"
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then why="timed out after ${secs} s"; fi
    row "$stem" "$stem" failed "$why: $(grep -v '^\s*$' "$DIR/$stem.log" | tail -n 1 | cut -c1-150)"
    tail -n 5 "$DIR/$stem.log" >&2 || true
  fi
done

# Megatron-Bridge, in its own environment, where there is one
MB_GB=8
MB_SL=2048
ROWS+=("$DIR/megatron.json")
if "$MB_PY" -c "import megatron.bridge" >/dev/null 2>&1; then
  if [[ -f "$MB_DIR/scripts/training/run_recipe.py" ]]; then
    rc=0
    timeout --kill-after=10 "$MEGATRON_S" "$MB_PY" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=1 \
      "$MB_DIR/scripts/training/run_recipe.py" --recipe nemotron_3_nano_4b_pretrain_config --mode pretrain \
      --dataset mock -sl "$MB_SL" -gb "$MB_GB" -mb 1 -ms 12 -tp 1 -pp 1 -cp 1 -ep 1 \
      checkpoint.save=null logger.log_interval=1 >"$DIR/megatron.log" 2>&1 || rc=$?
    # the iterations logged before a timeout still give a rate
    "$PY" "$CHECK" megatron-log "$DIR/megatron.log" --global-batch "$MB_GB" --seq-length "$MB_SL" \
      --gpu-name "$GPU_NAME" --out "$DIR/megatron.json"
    if [[ $rc -ne 0 ]] && ! grep -q '"status": "ok"' "$DIR/megatron.json"; then
      row megatron "Megatron-Bridge: pretrain" failed "exit $rc; log: $DIR/megatron.log"
    fi
  else
    row megatron "Megatron-Bridge: pretrain" skipped \
      "megatron.bridge imports but $MB_DIR/scripts/training/run_recipe.py is missing (set MEGATRON_BRIDGE_DIR)"
  fi
else
  row megatron "Megatron-Bridge: pretrain" "not installed" \
    "no Megatron-Bridge here (not in the wheelhouse); in the NeMo container set MEGATRON_PYTHON=python"
fi

"$PY" "$CHECK" table "${ROWS[@]}" --title "GPU check: $GPU_NAME ($((SECONDS - START)) s)" --json "$DIR/gpu_check.json" \
  | tee "$DIR/gpu_check.txt"
if [[ -n "${OUT:-}" ]]; then
  mkdir -p "$OUT"
  cp "$DIR/gpu_check.json" "$DIR/gpu_check.txt" "$OUT/"
  for log in "$DIR"/*.log; do echo "==> $(basename "$log")"; tail -n 200 "$log"; done >"$OUT/gpu_check.log"
fi
