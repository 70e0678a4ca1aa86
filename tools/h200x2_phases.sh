#!/bin/bash
# Every 2×H200 measurement of issues #14 (async speedup) and #8 (trainer at scale) in one detached run,
# as named phases (tools/README.md): start it with setsid, then poll its logs.
#
#   source .device-stage/bin/env.sh
#   setsid bash tools/h200x2_phases.sh /tmp/arl-session [phases] </dev/null >/dev/null 2>&1 &
#   tail /tmp/arl-session/progress.log
#
# Copy results back without the run folders' model weights:
#   cd /tmp && find arl-session -name "*.log" -o -name "*.json" -o -name "*.jsonl" | tar czf /tmp/logs.tgz -T -
#
# phases (default: what has not run yet on two GPUs, longcompare,sync8b,coloc2,tp2, #14's balanced-workload
# aim first; any list in any order):
#   rates      raw_vllm_rates.py: the small workload on GPU 0 beside the balanced one on GPU 1
#   trainer    arl-trainer's GPU tests on GPU 0 beside the activation-offload and KL-reference benchmarks on GPU 1
#   small      apps/bench compare, colocated vs mode d, random Qwen3-0.6B shape (configs/h200x2.toml)
#   fsdp       train_7b_fsdp.py (FSDP2, Qwen2.5-7B shape, 8k rows) and the app's two-rank FSDP2 test
#   balanced   the same compare on the random Qwen3-1.7B shape
#   longprompt raw rates of the long-prompt workload (GPU 0), then the compare with ~1,000-token prompts
#              (340 words of the tiny tokenizer, ~3 tokens each): measured ideal 1.23–1.29×
#              (1.30–1.40× with the KL loss: longcompare)
#   measure    side by side, one GPU each: the profiled 0.5B trainer step then long-prompt raw rates
#              (GPU 0); arl-trainer's GPU tests, the LM-head benchmark and the CUDA IPC sweep (GPU 1);
#              one after the other on a one-GPU machine
#   longcompare  the long-prompt compare with GRPO's KL loss to a reference (kl_coef 0.001, the workload
#              whose measured ideal is highest: 1.30–1.40×), then without it (1.23–1.29×)
#   coloc2     the small and long-prompt (KL) compares against colocated on both GPUs (two FSDP2 trainer
#              ranks, two replicas, each rank syncing the replica on its GPU by CUDA IPC) instead of
#              one GPU counted twice
#   sync8b     the app colocated on both GPUs with the random Qwen3-8B shape (FSDP2, 2 ranks): each rank
#              sends the gathered 8B weights to the replica on its GPU by CUDA IPC every step; the
#              end-of-run check compares both replicas with the trainer by digests
#   verify1    one GPU: the app colocated with vLLM (its end-of-run check by digests on the GPU), the
#              weights-check cost (digests vs tensors) at 0.5B and 7B,
#              then the GPU tests of arl-trainer and arl-sync
#   sync7b     one GPU: the 7B sync into a vLLM replica on the same GPU (CUDA IPC) from arl-trainer's
#              FSDP2 policy (gathered parameter by parameter), then from a plain bf16 state dict
#   offloadbench  one GPU, no vLLM: optimizer_offload's and HostArena's GPU tests, then
#              optimizer_offload.py (7B shape: state resident vs offloaded vs offloaded with the prefetch)
#              and host_state_memory.py (pinned tensors vs HostArena, its pages touched first or not)
#   alloc8b    one GPU: the allocator's expandable segments for the trainer ranks, side by side: first
#              optimizer_offload.py (no vLLM) at the app's batch (32 rows of 192 tokens, the cache
#              emptied between steps) with expandable segments off and on, then offload8b's app run
#              with the default (actor.expandable_segments=false) and with true
#   profile8b  one GPU: offload8b's app run with its second step under torch.profiler (trainer.profile_step)
#   pace8b     one GPU: offload8b's app run with the prefetch's copies all queued at once
#              (actor.optimizer_prefetch_inflight_mb=0), then paced (the default, 256 MiB)
#   overlap8b  one GPU: pace8b's paced run with the state's way out inside the trainer step
#              (actor.optimizer_offload_overlap=false), then beside the sync (the default), then that
#              with vLLM sleep level 2
#   offload8b  one GPU: the app colocated with the random Qwen3-8B shape (~7B parameters) on that GPU:
#              trainer, AdamW state in host memory between steps (prefetched back during the forward
#              and backward), vLLM replica, CUDA IPC sync. MODEL_DTYPE (default float32: fp32 master
#              weights; the 2026-12-01 run had the preset's bfloat16)
#   resident8b the same app run with the AdamW state and gradients kept on the GPU (the baseline: on one
#              H200 it runs out of memory when the replica's KV cache wakes, 2026-12-02)
#   sleep2     offload8b's run with vLLM sleep level 2: the replica drops its weights instead of moving
#              them to host memory, since every sync overwrites them (against offload8b's sleep and
#              wake_weights times; the end-of-run digest check says whether anything was lost)
#   fsdp7b1    one GPU: the 7B shape as one FSDP2 rank with fused AdamW, eager vs compile_layers
#              (16k-token micro-batches, full checkpointing)
#   tp2        tools/gpu_app_smoke.sh tp2: one replica over two GPUs (vLLM "mp"
#              executor), every TP worker receiving the full tensors
#   fsdpcompile  compile_layers under FSDP2 (every GPU, at most 2): its GPU tests, then eager vs compiled
#              side by side at the 0.5B shape (32k-token micro-batches) and the 7B shape (16k, full
#              checkpointing); needs only torch and the staged deps (no vLLM)
set -u
LOG=${1:-/tmp/arl-session}
PHASES=${2:-longcompare,sync8b,coloc2,tp2}
LONG_PROMPT=("data.source=builtin:longtail?median=659&p99_ratio=6.27&max=7168&prompt_words=340" rollout.max_tokens=7168)
LONG_PROMPT_KL=("${LONG_PROMPT[@]}" actor.algorithm.kl_coef=0.001)  # raw_vllm_rates' long-prompt-kl
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "$(date +%T) $*" >> "$LOG/progress.log"; }
# The colocated baseline: one GPU with half the batch counted twice, unless the caller sets both.
COLOCATED_OVERRIDES=${COLOCATED_OVERRIDES:-actor.ppo_mini_batch_size=8}
COLOCATED_SCALE=${COLOCATED_SCALE:-2}
compare() {  # name overrides...
  local name=$1; shift
  timeout 900 python apps/bench/__main__.py compare --preset h200x2 --modes colocated,d --warmup-steps 1 \
    --colocated-overrides "$COLOCATED_OVERRIDES" --colocated-scale "$COLOCATED_SCALE" \
    --out "$LOG/bench_$name" "$@" > "$LOG/bench_$name.log" 2>&1
  say "compare $name exit $?"
}
coloc8b() {  # name overrides...: the app colocated on one GPU with the ~7B Qwen3-8B body, fused AdamW
  local name=$1; shift
  timeout 900 python apps/train/__main__.py --config apps/bench/configs/h200x2.toml model.path=builtin:qwen3-8b-random \
    model.dtype=${MODEL_DTYPE:-float32} resources.colocate=true rollout.gpu_memory_utilization=0.3 trainer.total_steps=3 \
    actor.ppo_mini_batch_size=8 rollout.n=4 rollout.max_tokens=256 "data.source=builtin:longtail?median=128&p99_ratio=2&max=256" \
    actor.activation_checkpointing=full actor.optim.fused=true trainer.save_final=false output.dir=$LOG/$name "$@" \
    > "$LOG/$name.log" 2>&1
  say "$name exit $?"
}
say "start: $PHASES"
for phase in ${PHASES//,/ }; do
  say "phase $phase"
  case $phase in
    rates)
      OUT=$LOG/rates_small CUDA_VISIBLE_DEVICES=0 timeout 540 python apps/bench/benchmarks/raw_vllm_rates.py \
        --workloads small --budget-s 420 > "$LOG/rates_small.log" 2>&1 &
      OUT=$LOG/rates_balanced CUDA_VISIBLE_DEVICES=1 timeout 540 python apps/bench/benchmarks/raw_vllm_rates.py \
        --workloads balanced --budget-s 420 > "$LOG/rates_balanced.log" 2>&1 &
      wait; say "rates done" ;;
    trainer)
      CUDA_VISIBLE_DEVICES=0 timeout 400 python -m pytest -q -m gpu packages/arl-trainer/tests -p no:cacheprovider \
        > "$LOG/trainer_tests.log" 2>&1 &
      (export CUDA_VISIBLE_DEVICES=1 OUT=$LOG/trainer_bench; mkdir -p "$OUT"
       timeout 200 python packages/arl-trainer/benchmarks/activation_offload.py > "$LOG/activation_offload.log" 2>&1
       timeout 200 python packages/arl-trainer/benchmarks/reference_policy.py > "$LOG/reference_policy.log" 2>&1) &
      wait; say "trainer done" ;;
    small) compare small ;;
    fsdp)
      OUT=$LOG/fsdp timeout 420 python packages/arl-trainer/benchmarks/train_7b_fsdp.py > "$LOG/train_7b_fsdp.log" 2>&1
      say "train_7b_fsdp exit $?"
      timeout 300 python -m pytest -q -m gpu tests/test_train_fsdp_gpu.py -p no:cacheprovider > "$LOG/fsdp_app_test.log" 2>&1
      say "fsdp app test exit $?" ;;
    balanced) compare balanced model.path=builtin:qwen3-1.7b-random ;;
    longprompt)
      OUT=$LOG/rates_long_prompt CUDA_VISIBLE_DEVICES=0 timeout 420 python apps/bench/benchmarks/raw_vllm_rates.py \
        --workloads long-prompt --budget-s 400 > "$LOG/rates_long_prompt.log" 2>&1
      say "rates long-prompt exit $?"
      compare long_prompt "${LONG_PROMPT[@]}" ;;
    measure)  # two chains, one per GPU; one after the other on GPU 0 when the machine has one GPU
      gpu1=1; [ "$(nvidia-smi -L | wc -l)" -lt 2 ] && gpu1=0
      chain1() {
        export CUDA_VISIBLE_DEVICES=$gpu1 OUT=$LOG/measure1; mkdir -p "$OUT"
        timeout 400 python -m pytest -q -m gpu packages/arl-trainer/tests -p no:cacheprovider > "$LOG/trainer_tests.log" 2>&1
        say "trainer tests exit $?"
        timeout 200 python packages/arl-trainer/benchmarks/head_memory.py > "$LOG/head_memory.log" 2>&1
        say "head_memory exit $?"
        PYTHONPATH=packages/arl-sync/src:${PYTHONPATH:-} timeout 200 python packages/arl-sync/benchmarks/bench_gpu.py \
          --model 7b --paths ipc --buckets 256,1024,4096 --rounds 3 > "$LOG/sync_ipc.log" 2>&1
        say "sync ipc exit $?"
      }
      chain0() {
        export CUDA_VISIBLE_DEVICES=0 OUT=$LOG/measure0; mkdir -p "$OUT"
        ARL_PROFILE=1 timeout 400 python packages/arl-trainer/benchmarks/train_05b.py > "$LOG/train_05b.log" 2>&1
        say "train_05b exit $?"
        timeout 420 python apps/bench/benchmarks/raw_vllm_rates.py --workloads long-prompt --budget-s 300 \
          > "$LOG/rates_long_prompt.log" 2>&1
        say "rates long-prompt exit $?"
      }
      if [ "$gpu1" = 1 ]; then (chain1) & (chain0) & wait; else (chain1); (chain0); fi ;;
    longcompare)
      compare long_prompt_kl "${LONG_PROMPT_KL[@]}"
      compare long_prompt "${LONG_PROMPT[@]}" ;;
    coloc2)
      COLOCATED_OVERRIDES="resources.trainer_gpus=2 rollout.replicas=2" COLOCATED_SCALE=1
      compare coloc2_small
      compare coloc2_long_prompt_kl "${LONG_PROMPT_KL[@]}"
      COLOCATED_OVERRIDES=actor.ppo_mini_batch_size=8 COLOCATED_SCALE=2 ;;
    sync8b)
      timeout 900 python apps/train/__main__.py --config apps/bench/configs/h200x2.toml model.path=builtin:qwen3-8b-random \
        resources.colocate=true resources.trainer_gpus=2 rollout.replicas=2 rollout.gpu_memory_utilization=0.3 \
        trainer.total_steps=3 actor.ppo_mini_batch_size=8 rollout.n=4 rollout.max_tokens=256 \
        "data.source=builtin:longtail?median=128&p99_ratio=2&max=256" actor.activation_checkpointing=full \
        trainer.save_final=false output.dir=$LOG/sync8b > "$LOG/sync8b.log" 2>&1
      say "sync8b exit $?" ;;
    verify1)
      export CUDA_VISIBLE_DEVICES=0
      timeout 420 python -m pytest -q -m gpu tests/test_train_gpu.py -k colocated -p no:cacheprovider \
        > "$LOG/app_gpu_test.log" 2>&1
      say "app gpu test exit $?"
      for model in 0.5b 7b; do
        mkdir -p "$LOG/check_cost_$model"
        OUT=$LOG/check_cost_$model timeout 300 python packages/arl-rollout/benchmarks/weights_check_cost.py \
          --model $model --device cuda > "$LOG/weights_check_cost_$model.log" 2>&1
        say "weights_check_cost $model exit $?"
      done
      timeout 500 python -m pytest -q -m gpu packages/arl-trainer/tests packages/arl-sync/tests -p no:cacheprovider \
        > "$LOG/trainer_sync_tests.log" 2>&1
      say "trainer+sync gpu tests exit $?" ;;
    sync7b)
      export CUDA_VISIBLE_DEVICES=0
      for source in fsdp2 state-dict; do
        mkdir -p "$LOG/sync7b_$source"
        OUT=$LOG/sync7b_$source timeout 420 python packages/arl-rollout/benchmarks/sync_7b_vllm.py --source $source \
          --rounds 5 > "$LOG/sync7b_$source.log" 2>&1
        say "sync7b $source exit $?"
      done ;;
    offloadbench)
      export CUDA_VISIBLE_DEVICES=0 OUT=$LOG/offloadbench; mkdir -p "$OUT"
      timeout 300 python -m pytest -q -m gpu packages/arl-trainer/tests/test_gpu.py -k "optimizer_offload or host_arena" \
        -p no:cacheprovider > "$LOG/offload_tests.log" 2>&1
      say "offload tests exit $?"
      timeout 420 python packages/arl-trainer/benchmarks/optimizer_offload.py > "$LOG/optimizer_offload.log" 2>&1
      say "optimizer_offload.py exit $?"
      timeout 200 python packages/arl-trainer/benchmarks/host_state_memory.py --layers 4 > "$LOG/host_state_memory.log" 2>&1
      say "host_state_memory.py exit $?" ;;
    offload8b) export CUDA_VISIBLE_DEVICES=0; coloc8b offload8b actor.optimizer_offload=true ;;
    resident8b) export CUDA_VISIBLE_DEVICES=0; coloc8b resident8b actor.optimizer_offload=false ;;
    tp2)
      OUT=$LOG/tp2 BUDGET_S=420 bash tools/gpu_app_smoke.sh tp2 > "$LOG/tp2.log" 2>&1
      say "tp2 exit $?" ;;
    sleep2) export CUDA_VISIBLE_DEVICES=0; coloc8b sleep2_8b actor.optimizer_offload=true rollout.sleep_level=2 ;;
    fsdp7b1)
      export CUDA_VISIBLE_DEVICES=0
      mkdir -p "$LOG/fsdp_7b_one"
      OUT=$LOG/fsdp_7b_one timeout 600 python packages/arl-trainer/benchmarks/train_7b_fsdp.py --shape 7b \
        --configs 16384:full,16384:full:compile --fused-optimizer > "$LOG/fsdp_7b_one.log" 2>&1
      say "fsdp 7b one rank exit $?" ;;
    profile8b) export CUDA_VISIBLE_DEVICES=0; coloc8b profile8b actor.optimizer_offload=true trainer.profile_step=2 ;;
    pace8b)
      export CUDA_VISIBLE_DEVICES=0
      coloc8b pace8b_at_once actor.optimizer_offload=true actor.optimizer_prefetch_inflight_mb=0
      coloc8b pace8b_paced actor.optimizer_offload=true ;;
    overlap8b)
      export CUDA_VISIBLE_DEVICES=0
      coloc8b overlap8b_in_step actor.optimizer_offload=true actor.optimizer_offload_overlap=false
      coloc8b overlap8b_beside_sync actor.optimizer_offload=true
      coloc8b overlap8b_sleep2 actor.optimizer_offload=true rollout.sleep_level=2 ;;
    alloc8b)
      export CUDA_VISIBLE_DEVICES=0
      for alloc in False True; do
        mkdir -p "$LOG/alloc_bench_$alloc"
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:$alloc OUT=$LOG/alloc_bench_$alloc timeout 300 \
          python packages/arl-trainer/benchmarks/optimizer_offload.py --rows 32 --row-tokens 192 --steps 3 \
          --empty-cache-between-steps --runs resident,offload_prefetch > "$LOG/alloc_bench_$alloc.log" 2>&1
        say "optimizer_offload expandable_segments:$alloc exit $?"
      done
      coloc8b alloc8b_fixed actor.optimizer_offload=true
      coloc8b alloc8b_expandable actor.optimizer_offload=true actor.expandable_segments=true ;;
    fsdpcompile)
      timeout 400 python -m pytest -q -m gpu packages/arl-trainer/tests/test_gpu.py -k compiled -p no:cacheprovider \
        > "$LOG/compile_tests.log" 2>&1
      say "compile tests exit $?"
      mkdir -p "$LOG/fsdp_05b" "$LOG/fsdp_7b"
      OUT=$LOG/fsdp_05b timeout 420 python packages/arl-trainer/benchmarks/train_7b_fsdp.py --shape 0.5b \
        --configs 32768:none,32768:none:compile > "$LOG/fsdp_05b.log" 2>&1
      say "fsdp 0.5b exit $?"
      OUT=$LOG/fsdp_7b timeout 700 python packages/arl-trainer/benchmarks/train_7b_fsdp.py --shape 7b \
        --configs 16384:full,16384:full:compile > "$LOG/fsdp_7b.log" 2>&1
      say "fsdp 7b exit $?" ;;
  esac
done
say "all done"
