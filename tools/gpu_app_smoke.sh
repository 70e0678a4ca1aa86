#!/bin/bash
# The whole app on GPUs with vLLM, within BUDGET_S seconds (default 470; < 8 min on 2×H200), from the
# sources without uv: `source .device-stage/bin/env.sh` first (tools/README.md).
#
#   bash tools/gpu_app_smoke.sh [split,colocated,tp2,synctests,ipcbench]
#
# split      trainer on GPU 0, one vLLM replica on GPU 1, mode d, 20 steps, weights over NCCL
# colocated  trainer and one replica taking turns on one GPU (vLLM sleeps), 20 steps, CUDA IPC
# tp2        one replica over two GPUs (vLLM "mp" executor), every TP worker receiving the full
#            tensors; the trainer on a third GPU (NCCL), or with 2 GPUs on the CPU ("cpu" transport,
#            staged into each worker's GPU), 5 steps
# graphs     the split layout with torch.compile + CUDA graphs (rollout.enforce_eager=false), 10 steps
# synctests  arl-sync's GPU tests (CUDA IPC single copy, NCCL)
# ipcbench   arl-sync's CUDA IPC transfer of a 7B shape vs a same-run device-to-device copy
#
# Each app part prints its log's progress lines (with per-phase sync ms) and one JSON block (layout,
# reward, engine-weights check, sync phases), also written to $OUT/<part>.json.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0} VLLM_WORKER_MULTIPROC_METHOD=${VLLM_WORKER_MULTIPROC_METHOD:-spawn}
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
OUT=${OUT:-/tmp/arl-gpu-smoke}
mkdir -p "$OUT"
case ":${PYTHONPATH:-}:" in
  *"$PWD/apps/train/src"*) ;;
  *) export PYTHONPATH=$(ls -d "$PWD"/packages/*/src "$PWD"/apps/*/src | paste -sd:):${PYTHONPATH:-} ;;
esac
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
python -c "import torch, vllm, ray; print('torch', torch.__version__, '| vllm', vllm.__version__, '| ray', ray.__version__, '| gpus', torch.cuda.device_count())" || exit 1
END=$(( $(date +%s) + ${BUDGET_S:-470} ))  # every part stops by then
cap() { local left=$(( END - $(date +%s) )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo $1; }
CONFIG=apps/train/configs/gpu_tiny.toml
STEPS=${STEPS:-20}

app() {  # name timeout overrides...
  local name=$1 limit=$2; shift 2
  rm -rf "$OUT/$name"
  timeout "$(cap "$limit")" python apps/train/__main__.py --config $CONFIG trainer.total_steps=$STEPS \
    output.dir="$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
  echo "exit $?"
  grep -E "^arl|^step|Error|error" "$OUT/$name.log" | grep -v "^arl-train: metrics" | tail -40
  python apps/train/benchmarks/summarize_run.py "$OUT/$name" "$name"
}

PARTS=${1:-split,colocated,tp2}
for part in ${PARTS//,/ }; do
  echo "===== $part ($(date +%T), $(( END - $(date +%s) )) s left)"
  case $part in
    split)
      (( GPUS >= 2 )) || { echo "skipped: needs 2 GPUs"; continue; }
      app split 240 ;;
    colocated)
      app colocated 200 resources.colocate=true ;;
    graphs)
      (( GPUS >= 2 )) || { echo "skipped: needs 2 GPUs"; continue; }
      app graphs 240 rollout.enforce_eager=false trainer.total_steps=10 ;;
    tp2)
      (( GPUS >= 2 )) || { echo "skipped: needs 2 GPUs"; continue; }
      TRAINER_GPUS=$(( GPUS >= 3 ? 1 : 0 ))
      app tp2 200 resources.tensor_parallel_size=2 resources.trainer_gpus=$TRAINER_GPUS trainer.total_steps=5 ;;
    synctests)
      timeout "$(cap 200)" python -m pytest -q -m gpu packages/arl-sync/tests -p no:cacheprovider 2>&1 | tail -15 ;;
    ipcbench)
      timeout "$(cap 240)" python packages/arl-sync/benchmarks/bench_gpu.py --model 7b --paths ipc \
        --buckets ${BUCKETS:-64,256} --rounds ${ROUNDS:-3} 2>&1 | tail -12 ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "===== done ($(date +%T))"
