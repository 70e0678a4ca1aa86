#!/bin/bash
# The multi-GPU runs of arl-sync and of the split-vs-colocated benchmark, in one go, on a machine with
# two GPUs with torch and cupy (pyzmq/msgspec installed from wheels in packages/arl-sync/.whl when that
# folder exists; tools/README.md). Logs go to $OUT (or /tmp/arl-device-out).
#
#   bash tools/run_device.sh tests,nccl,split
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/arl-device-out}
mkdir -p "$OUT"
if ls packages/arl-sync/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    packages/arl-sync/.whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$(ls -d "$PWD"/packages/*/src | paste -sd:)
nvidia-smi topo -m 2>&1 | head -8
python3 -c "import torch, cupy, transformers; from cupy.cuda import nccl; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'cupy', cupy.__version__, 'nccl', nccl.get_version(), 'transformers', transformers.__version__)"
END=$(( $(date +%s) + ${BUDGET_S:-100000} ))  # stop every part by then
cap() { local left=$(( END - $(date +%s) )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo $1; }
for part in ${1//,/ }; do
  echo "===== $part ($(date +%T))"
  case $part in
    tests)
      timeout $(cap 200) python3 -m pytest -q -m gpu packages/arl-sync/tests -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" ;;
    nccl)
      NCCL_DEBUG=INFO timeout $(cap 300) python3 packages/arl-sync/benchmarks/bench_nccl.py --gpus 2 --model 0.5b,7b \
        --buckets ${BUCKETS:-4,16,64,256,1024} --rounds ${ROUNDS:-5} > "$OUT/nccl_full.log" 2>&1
      echo "exit $?"; grep -v "NCCL INFO" "$OUT/nccl_full.log"; grep -m4 " via " "$OUT/nccl_full.log" ;;
    split)
      NCCL_DEBUG=INFO timeout $(cap ${SPLIT_TIMEOUT:-540}) python3 apps/train/benchmarks/split_vs_colocated.py \
        --configs ${CONFIGS:-split,colocated} --out "$OUT/split.json" ${SPLIT_ARGS:-} > "$OUT/split_full.log" 2>&1
      echo "exit $?"; grep -v "NCCL INFO\|Loading weights\|Writing model" "$OUT/split_full.log"
      grep -m4 " via " "$OUT/split_full.log" ;;
  esac
done
echo "===== done ($(date +%T))"
