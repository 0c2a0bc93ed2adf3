#!/usr/bin/env bash
# One call on a lent GPU machine, prepared ahead (the device tool gives a session about 15 minutes in all):
#   every reference solution's real cell on NCCL (./course gpu-check, 8 puzzles at a time), notebook 01's activation
#   memory against its formula (bench.activations and pytest -m gpu), and the notebooks' main algorithms beside
#   PyTorch's own on one NCCL rank (bench rows at world size 1: compute and memory traffic only, no communication;
#   pipelines need 2 stages and are left out). Everything lands in $OUT (8 files at most come back).
#   Locally: OUT=/tmp/gpu-session bash bench/gpu_session.sh
set -u
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING=false
ROWS=ddp,zero1,zero2,zero3,fsdp-prefetch,tp-mlp,tp-dp,moe,ring-attention,diloco

{ date -u; nvidia-smi -L 2>&1; nproc; $PY -c "import platform, torch; print('Python', platform.python_version(), \
'torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version() if torch.cuda.is_available() \
else None, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"; } > "$OUT/machine.txt" 2>&1

# notebook 01's memory beside the sweep: the allocator's counts are per process, so the sweep does not disturb them
( timeout 90 $PY -m bench.activations; timeout 120 $PY -m pytest -p no:cacheprovider -n 2 -q -rs -m gpu \
    tests/test_activation_variants.py ) > "$OUT/activations.log" 2>&1 &

timeout "${GPU_CHECK_S:-300}" $PY -m tools.gpu_check --jobs "${JOBS:-8}" --timeout 150 --out "$OUT/gpu-check.md" \
    > "$OUT/gpu-check.log" 2>&1
echo "gpu-check exited $? after ${SECONDS} s" >> "$OUT/gpu-check.log"
wait

# timings last, on a quiet GPU
timeout "${ROWS_S:-200}" $PY -m bench --only rows --world 1 --backend "${BACKEND:-nccl}" --rows "$ROWS" --repeats 2 --steps 5 \
    --out "$OUT/rows" > "$OUT/rows.log" 2>&1
echo "rows exited $? at ${SECONDS} s" >> "$OUT/rows.log"
