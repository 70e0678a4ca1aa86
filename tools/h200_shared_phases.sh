#!/bin/bash
# Issue #30 on ONE H200: colocated (synchronous turn-taking) vs the shared-GPU schedules time_sliced and
# concurrent, on the long-tail workload (random Qwen3-0.6B shape, 16 prompts × 8 per step) and on
# long-prompt-kl (1,024-token prompts, KL to the reference), then raw_vllm_rates with --share (engine
# alone, trainer alone, both at once in two processes on the GPU) for the ideals. One detached job of
# named phases (tools/README.md):
#
#   source .device-stage/bin/env.sh
#   setsid bash tools/h200_shared_phases.sh /tmp/s30 [phases] </dev/null >/dev/null 2>&1 &
#   tail /tmp/s30/progress.log
#
# Copy back what is done at every look, so that a machine lost mid-run loses nothing finished:
#
#   tail -3 /tmp/s30/progress.log
#   tar czf /tmp/s30.tgz -C /tmp/s30 --exclude=model --exclude='checkpoint*' --exclude='*.safetensors' .
#
# phases (default small,longkl,rates): small | longkl (the compares; 9 steps, 1 warm-up: 8 measured) |
# rates (raw_vllm_rates --share, both workloads; RATES_REQUESTS requests each, default 256) | ratessmall | rateskl |
# the concurrent study on the small workload, one compare each: conc (as the app runs it: up to 256
# sequences in flight) | conccap (128 in flight, as raw_vllm_rates --share) | concmps and conccapmps (the same
# with an MPS control daemon running, so that the two processes' kernels can overlap instead of being
# time-sliced by the GPU) | smallmps, longklmps (all three schedules under MPS) | longklmpsconc (colocated, and
# concurrent under the run's own MPS daemon: resources.mps=start) | small17 (the three schedules on the
# Qwen3-1.7B shape, concurrent with resources.mps=start, its replica sized by compare --size-concurrent from
# the trainer's peak in the colocated and time_sliced runs and the card's memory (0.35 of an 80 GiB H100 left
# the trainer out of memory), plus SMALL17_CONC_EXTRA, e.g. actor.max_tokens_per_microbatch=8192; SMALL17_MEM,
# default 0.35, only where no peak was measured) | longklsm (long-prompt-kl: colocated, time_sliced (the
# replica's refilled rate) and concurrent under the run's MPS with the trainer capped at SM_PCT% of the SMs,
# default 60, its trainer's allocator on expandable segments (the sized replica left too little room for the
# fragmented cache otherwise), the replica sized by compare --size-concurrent from the two earlier runs' trainer peak;
# CONC_MEM, default 0.45, only where no peak was measured) | longkl17 (long-prompt-kl on the
# Qwen3-1.7B shape: the three schedules, concurrent as longklsm with SM_PCT default 80, CONC_MEM default 0.40) |
# longkl17ts (longkl17's time_sliced and colocated, time_sliced first, or LONGKL17TS_MODES; both with
# actor.expandable_segments=true) | longklcaps (long-prompt-kl: colocated once, then concurrent under the
# run's MPS at each trainer SM cap of SM_PCTS, default "70 60", replica CONC_MEM (default 0.45), trainer on
# expandable segments unless CAPS_EXPANDABLE=false; CAPS_BASE_MODES, default colocated, are the modes run once
# before (colocated,time_sliced adds time_sliced's refilled decode rate: the at-once bound); each cap's folder
# gets a copy of those runs and its report; STEPS=12 kept concurrent's window steady at 75%) |
# nanprobe (arl-trainer's benchmarks/nonfinite_probe.py, no app: a few train steps in each setting of
# NANPROBE_CASES, default "plain mps_nocheck mps mps_load": allocator on expandable segments (exp), an MPS
# client with the SMs capped at SM_PCT, default 75 (mps), the trainer's startup GEMM check off (nocheck),
# a neighbour process busy with matmuls on the GPU throughout (load); ~30 s each on an H100) |
# gemmcaps (arl-trainer's benchmarks/gemm_check_probe.py under MPS at each cap of SM_PCTS, default
# "25 50 60 70 75 80 90 100": the SMs seen, the SM target the startup check chose, the error after; ~10 s each) | concnan (long-prompt-kl, concurrent only,
# STEPS steps, one compare per case of CONCNAN_CASES, default "exp_cap plain_cap exp_nocap exp_nomps": which of
# the trainer's expandable segments, MPS and its SM cap the non-finite training of the capped concurrent runs
# needs; the report names a mode that trained on NaN) |
# conv: issue #29's loss conventions on a learnable long tail, time-sliced (packages/arl-trainer/benchmarks/
# conventions_sweep.py --workload h200_longtail: one run per arm, CONV_ARMS (default: the KL, norm_len and
# seq-IS denominator arms), CONV_STEPS steps (default 30; ~4.5 min per arm at 20 on an H100), seed 0)
set -u
LOG=${1:-/tmp/s30}
PHASES=${2:-small,longkl,rates}
STEPS=${STEPS:-9}
LONG_PROMPT_KL=("data.source=builtin:longtail?median=659&p99_ratio=6.27&max=7168&prompt_words=340" rollout.max_tokens=7168
                actor.algorithm.kl_coef=0.001)
# Both shared schedules: a staleness budget of one step keeps the replica's batch refilled (32 prompts
# × 8 in flight at most); concurrent: the replica's memory share (its KV cache holds that batch).
SHARED=${SHARED:-"async_training.staleness_threshold=1.0"}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
say() { echo "$(date +%T) $*" >> "$LOG/progress.log"; }
compare() {  # name modes concurrent-memory rates-workload overrides...
  local name=$1 modes=$2 mem=$3 rw=$4; shift 4
  local rates=()
  [ -f "$LOG/rates/raw_rates.json" ] && rates=(--rates "$LOG/rates/raw_rates.json" --rates-workload "$rw")
  timeout 1500 python apps/bench/__main__.py compare --preset h200x2 --modes "$modes" --warmup-steps 1 ${COMPARE_FLAGS:-} \
    --shared-overrides "$SHARED" --concurrent-overrides "rollout.gpu_memory_utilization=$mem ${CONC_EXTRA:-}" "${rates[@]}" \
    --out "$LOG/bench_$name" trainer.total_steps=$STEPS "$@" > "$LOG/bench_$name.log" 2>&1
  say "compare $name exit $?"
  # Stopped by its timeout: the report from the runs that finished.
  [ -f "$LOG/bench_$name/bench.json" ] || python apps/bench/__main__.py report "$LOG/bench_$name" --warmup-steps 1 \
    >> "$LOG/bench_$name.log" 2>&1
}
# MPS: a control daemon of its own (pipe and log under $LOG; the device's compute mode is left as it is).
# Every CUDA process started while it runs (the Ray workers inherit the environment) becomes its client.
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=$LOG/mps-pipe CUDA_MPS_LOG_DIRECTORY=$LOG/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && say "mps daemon started" || say "mps daemon failed to start"
}
mps_off() {
  echo quit | nvidia-cuda-mps-control; sleep 2
  say "mps daemon stopped; server log: $(tail -2 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tr '\n' ' ')"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
CAP=(rollout.max_concurrent_per_replica=16)
say "start: $PHASES"
{ nvidia-smi -q | grep -i -E "compute mode|product name"; which nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control";
  ls /tmp/nvidia-mps 2>&1; } > "$LOG/mps.txt" 2>&1
for phase in ${PHASES//,/ }; do
  say "phase $phase"
  case $phase in
    small) compare small colocated,time_sliced,concurrent 0.35 small ;;
    longkl) compare long_prompt_kl colocated,time_sliced,concurrent 0.45 long-prompt-kl "${LONG_PROMPT_KL[@]}" ;;
    smallshared) compare small_shared time_sliced,concurrent 0.35 small ;;
    conc) compare conc colocated,concurrent 0.35 small ;;
    conccap) compare conc_cap concurrent 0.35 small "${CAP[@]}" ;;
    concmps) mps_on; compare conc_mps concurrent 0.35 small; mps_off ;;
    conccapmps) mps_on; compare conc_cap_mps concurrent 0.35 small "${CAP[@]}"; mps_off ;;
    smallmps) mps_on; compare small_mps colocated,time_sliced,concurrent 0.35 small; mps_off ;;
    longklmps) mps_on; compare long_prompt_kl_mps colocated,time_sliced,concurrent 0.45 long-prompt-kl "${LONG_PROMPT_KL[@]}"; mps_off ;;
    longklmpsconc) CONC_EXTRA=resources.mps=start compare long_prompt_kl_mps colocated,concurrent 0.45 long-prompt-kl "${LONG_PROMPT_KL[@]}" ;;
    longklsm) CONC_EXTRA="resources.mps=start resources.mps_trainer_sm_percent=${SM_PCT:-60} actor.expandable_segments=true" \
        COMPARE_FLAGS=--size-concurrent \
        compare long_prompt_kl_sm colocated,time_sliced,concurrent "${CONC_MEM:-0.45}" long-prompt-kl "${LONG_PROMPT_KL[@]}" ;;
    longklcaps)  # colocated once, then concurrent at each cap of SM_PCTS, each reported against that colocated
      first=1; base_modes=${CAPS_BASE_MODES:-colocated}
      for pct in ${SM_PCTS:-70 60}; do
        modes=concurrent; [ $first = 1 ] && modes=$base_modes,concurrent
        CONC_EXTRA="resources.mps=start resources.mps_trainer_sm_percent=$pct actor.expandable_segments=${CAPS_EXPANDABLE:-true}" \
          compare "long_prompt_kl_cap$pct" $modes "${CONC_MEM:-0.45}" long-prompt-kl "${LONG_PROMPT_KL[@]}"
        if [ $first = 1 ]; then base=$LOG/bench_long_prompt_kl_cap$pct; first=0
        elif [ -d "${base:-}/colocated" ]; then
          for m in ${base_modes//,/ }; do cp -r "$base/$m" "$LOG/bench_long_prompt_kl_cap$pct/"; done
          python apps/bench/__main__.py report "$LOG/bench_long_prompt_kl_cap$pct" --warmup-steps 1 \
            >> "$LOG/bench_long_prompt_kl_cap$pct.log" 2>&1
        fi
      done ;;
    nanprobe)
      mps=0
      for case in ${NANPROBE_CASES:-plain mps_nocheck mps mps_load}; do
        [[ $case == *mps* && $mps == 0 ]] && { mps_on; mps=1; }
        env=(PROBE_CASE=$case OUT=$LOG/nanprobe)
        [[ $case == *exp* ]] && env+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
        [[ $case == *nocheck* ]] && env+=(PROBE_CHECK_GEMMS=0)
        # The cases without MPS run first; after the daemon started, a pipe directory nobody listens on
        # keeps a process out of it.
        [[ $case == *mps* ]] && env+=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${SM_PCT:-75}) || env+=(CUDA_MPS_PIPE_DIRECTORY=$LOG/no-mps)
        if [[ $case == *load* ]]; then
          env "${env[@]}" python -c "import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); t = time.time()
while time.time() - t < 90: a @ a
torch.cuda.synchronize()" & load=$!; sleep 5
        fi
        env "${env[@]}" timeout 300 python packages/arl-trainer/benchmarks/nonfinite_probe.py > "$LOG/nanprobe_$case.log" 2>&1
        say "nanprobe $case exit $? finite $(grep -o '"finite_steps": [0-9]*' "$LOG/nanprobe_$case.log")"
        [[ $case == *load* ]] && kill $load 2>/dev/null; wait 2>/dev/null
      done
      [ $mps = 1 ] && mps_off ;;
    gemmcaps)  # the trainer's startup GEMM check at each MPS SM cap of SM_PCTS
      mps_on
      for pct in ${SM_PCTS:-25 50 60 70 75 80 90 100}; do
        PROBE_CASE=cap$pct OUT=$LOG/gemmcaps CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct timeout 300 \
          python packages/arl-trainer/benchmarks/gemm_check_probe.py > "$LOG/gemmcaps_$pct.log" 2>&1
        say "gemmcaps $pct exit $? $(grep -o '"sm_count": [0-9]*\|"sm_target": [0-9a-z]*\|"worst_error_after": [0-9.e+-]*' "$LOG/gemmcaps_$pct.log" | tr '\n' ' ')"
      done
      mps_off ;;
    concnan)
      for case in ${CONCNAN_CASES:-exp_cap plain_cap exp_nocap exp_nomps}; do
        extra=""; mem=0.45
        [[ $case == *exp* ]] && extra+=" actor.expandable_segments=true" || mem=0.40
        [[ $case != *nomps ]] && extra+=" resources.mps=start"
        [[ $case == *_cap ]] && extra+=" resources.mps_trainer_sm_percent=${SM_PCT:-75}"
        CONC_EXTRA="$extra" compare "concnan_$case" concurrent $mem long-prompt-kl "${LONG_PROMPT_KL[@]}"
        say "concnan $case: $(grep -a 'trained on NaN' "$LOG/bench_concnan_$case.log" | head -1)"
      done ;;
    small17) CONC_EXTRA="resources.mps=start ${SMALL17_CONC_EXTRA:-}" COMPARE_FLAGS=--size-concurrent \
        compare small_17b colocated,time_sliced,concurrent "${SMALL17_MEM:-0.35}" balanced model.path=builtin:qwen3-1.7b-random ;;
    longkl17) CONC_EXTRA="resources.mps=start resources.mps_trainer_sm_percent=${SM_PCT:-80}" COMPARE_FLAGS=--size-concurrent \
        compare long_prompt_kl_17b colocated,time_sliced,concurrent "${CONC_MEM:-0.40}" long-prompt-kl "${LONG_PROMPT_KL[@]}" \
        model.path=builtin:qwen3-1.7b-random ;;
    longkl17ts) compare long_prompt_kl_17b_ts "${LONGKL17TS_MODES:-time_sliced,colocated}" 0.40 long-prompt-kl "${LONG_PROMPT_KL[@]}" \
        model.path=builtin:qwen3-1.7b-random actor.expandable_segments=true ;;
    conv)
      timeout 2400 python packages/arl-trainer/benchmarks/conventions_sweep.py --workload h200_longtail \
        --arms "${CONV_ARMS:-kl_k3,kl_clamped,norm_batch_max,norm_constant,seqis_prod_keep,seqis_prod_remove}" --seeds 0 --steps "${CONV_STEPS:-30}" \
        --out "$LOG/conventions" > "$LOG/conventions.log" 2>&1
      say "conventions exit $?" ;;
    rates|ratessmall|rateskl)
      w=small,long-prompt-kl; [ "$phase" = ratessmall ] && w=small; [ "$phase" = rateskl ] && w=long-prompt-kl
      OUT=$LOG/rates timeout 1500 python apps/bench/benchmarks/raw_vllm_rates.py --workloads $w --share \
        --gpu-memory-utilization 0.45 --requests ${RATES_REQUESTS:-256} --share-seconds 25 --budget-s 1400 > "$LOG/rates.log" 2>&1
      say "rates exit $?" ;;
    *) say "unknown phase $phase" ;;
  esac
done
say "done"
