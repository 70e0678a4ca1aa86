"""Split vs colocated: fully asynchronous RL (mode d) with the trainer and the rollout engine on
different GPUs of one host, against both on the same GPU.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=$(ls -d packages/*/src | paste -sd:):apps/train/benchmarks \\
        python3 apps/train/benchmarks/split_vs_colocated.py --configs split,colocated --steps 300

THE GENERATION SIDE IS NOT vLLM: it is arl's in-tree `TorchEngine` (transformers on CUDA, batched,
recomputing the whole sequence every token, no KV cache, sampling on the CPU). Everything else is
the real arl stack: the trainer process runs `HFPolicy` (fp32 master weights, AdamW) + `Trainer` +
`WeightPublisher` (arl-sync sender); the rollout process runs `TorchEngine` (bf16) behind a
`ServerManager` and a `Rollouter` with `staleness_threshold > 0` and `partial_rollout=True` (mode d:
a sync aborts in-flight generations and the server manager resumes them with the new weights), with
`arl.rollout.testing.TokenAgentLoop` as the task (prompt ids in the task, reward = fraction of even
tokens: no tokenizer). The model is a random-init Qwen3 (`Qwen3Config`, saved with save_pretrained).
Ray is not used: the two processes talk over `zmq_channel` (samples as msgspec-encoded arl.queue
Samples; pause / update_weights / resume), and the weights travel through arl-sync.

Configs (each runs the same trainer and rollout processes, only devices and transport differ):
  split      trainer on GPU 0, engine on GPU 1, weights by the "nccl" transport (GPU 0 → GPU 1);
  colocated  trainer and engine both on GPU 0 (two processes sharing the GPU), "cuda_ipc" transport;
  cpu        both on the CPU, "cpu" transport (a local smoke test of the plumbing).
Each process sees only its GPU (CUDA_VISIBLE_DEVICES, as Ray gives an actor its GPU).

Printed and written (`--out`, JSON): samples/s the trainer consumed and the rollout side produced
(after `--warmup-steps`), sync time per step (pause + transfer + resume, and the transfer alone),
and the reward curve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

CONFIGS = {
    "split": dict(trainer_gpu="0", rollout_gpu="1", transport="nccl"),
    "colocated": dict(trainer_gpu="0", rollout_gpu="0", transport="cuda_ipc"),
    "cpu": dict(trainer_gpu="", rollout_gpu="", transport="cpu"),
}


# ---------------------------------------------------------------------------------------------
# the model


def build_model(out: Path, args: argparse.Namespace) -> Path:
    """A random-init Qwen3 causal LM (fp32 safetensors), no tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(
        f"model: random-init Qwen3, {n / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers, "
        f"vocab {args.vocab}, head_dim {args.head_dim}) at {out}",
        flush=True,
    )
    return out


# ---------------------------------------------------------------------------------------------
# the rollout process


async def rollout_main(args: argparse.Namespace) -> None:
    import torch
    from zmq_channel import RolloutServer, encode_samples

    from arl.proxy.types import SamplingParams
    from arl.queue.queue import MessageQueue
    from arl.rollout import Rollouter, ServerManager, Task, compute_budget
    from arl.rollout.engines.torch_engine import TorchEngine, TorchEngineConfig
    from arl.rollout.testing import TokenAgentLoop

    torch.set_num_threads(args.threads)
    device = "cuda:0" if args.gpu_visible else "cpu"
    engine = TorchEngine(
        TorchEngineConfig(
            model_path=args.model_dir,
            device=device,
            dtype=args.engine_dtype,
            seed=args.seed,
            max_batch=args.max_batch,
        )
    )
    await engine.start()
    manager = ServerManager([engine], generate_timeout_s=600.0)
    budget = compute_budget(
        require_batches=1,
        ppo_mini_batch_size=args.mini_batch,
        staleness_threshold=args.staleness,
        trigger_parameter_sync_step=args.sync_every,
        replicas=1,
        per_replica=args.per_replica,
    )
    queue = MessageQueue(budget.max_queue)

    def tasks():
        rng = random.Random(args.seed)
        for i in range(10**9):
            ids = [rng.randrange(1, args.vocab) for _ in range(args.prompt_len)]
            yield 0, Task(id=f"t{i}", messages=[], agent="token", metadata={"prompt_ids": ids})

    rollouter = Rollouter(
        tasks=tasks(),
        manager=manager,
        sink=queue,
        agent_loops={"token": TokenAgentLoop()},
        sampling_params=SamplingParams(max_tokens=args.max_tokens, temperature=1.0),
        n=args.n,
        budget=budget,
        partial_rollout=True,
    )
    run_task = asyncio.create_task(rollouter.run())

    def alive() -> None:
        if run_task.done():
            run_task.result()
            raise RuntimeError("the rollouter stopped")

    async def get_batch(n: int, timeout: float) -> list[bytes]:
        alive()
        return encode_samples(await queue.get_batch(n, timeout))

    async def size() -> int:
        return queue.size()

    async def pause() -> None:
        alive()
        await rollouter.pause()

    async def update_weights(addr: str, cfg_json: bytes, version: int) -> None:
        await rollouter.update_weights(addr, cfg_json, version)

    async def resume(queued: int) -> None:
        await rollouter.resume(queued)

    async def stats() -> dict[str, Any]:
        alive()
        return rollouter.stats.as_dict() | {
            "resumed_requests": manager.resumed_requests,
            "engine_version": engine.weight_version,
            "queue_size": queue.size(),
            "t": time.monotonic(),
        }

    async def stop() -> None:
        pass

    server = RolloutServer(
        f"tcp://127.0.0.1:{args.port}",
        dict(
            get_batch=get_batch,
            size=size,
            pause=pause,
            update_weights=update_weights,
            resume=resume,
            stats=stats,
            stop=stop,
        ),
    )
    print(
        f"[rollout] ready: TorchEngine (NOT vLLM) on {device} ({args.engine_dtype}), budget {budget}",
        flush=True,
    )
    try:
        await server.serve()
    finally:
        run_task.cancel()
        try:
            await run_task
        except (asyncio.CancelledError, Exception):
            pass
        await engine.stop()
        server.close()


# ---------------------------------------------------------------------------------------------
# the trainer process


async def trainer_main(args: argparse.Namespace) -> None:
    import torch
    from zmq_channel import RolloutClient

    from arl.sync import SyncConfig
    from arl.trainer import HFPolicy, OptimConfig, Trainer, TrainerConfig, WeightPublisher

    torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("high")  # TF32 matmuls for the fp32 master weights
    device = "cuda:0" if args.gpu_visible else "cpu"
    tcfg = TrainerConfig(
        ppo_mini_batch_size=args.mini_batch,
        require_batches=1,
        trigger_parameter_sync_step=args.sync_every,
        temperature=1.0,
        batch_timeout_s=300.0,
        optim=OptimConfig(lr=args.lr, grad_clip=1.0),
    )
    policy = HFPolicy(args.model_dir, tcfg, device=device, dtype="float32", seed=args.seed)
    sync_cfg = SyncConfig(
        transport=args.transport,
        bucket_bytes=args.bucket_mb << 20,
        timeout_s=120.0,
        cast_dtype=args.engine_dtype if args.engine_dtype != "float32" else None,
    )
    publisher = WeightPublisher(sync_cfg, num_receivers=1)
    client = RolloutClient(f"tcp://127.0.0.1:{args.port}")
    trainer = Trainer(policy, client, client, publisher, tcfg, pad_token_id=0)
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    t_measure: float | None = None
    stats0: dict[str, Any] | None = None
    try:
        await client.stats()  # the rollout side is up
        print(
            f"[trainer] HFPolicy fp32 on {device}, transport {args.transport}, bucket {args.bucket_mb} MiB",
            flush=True,
        )
        for step in range(1, args.steps + 1):
            m = await trainer.train_step()
            m["t"] = time.perf_counter() - t_start
            rows.append(m)
            if step == args.warmup_steps:
                t_measure = time.perf_counter()
                stats0 = await client.stats()
            if step % args.log_every == 0 or step == 1:
                print(
                    f"[trainer] step {step:4d} reward {m['reward_mean']:.3f} samples/s {m['samples_per_s']:6.1f} "
                    f"sync {1e3 * m.get('sync_s', 0):6.1f} ms (transfer {1e3 * m.get('sync_transfer_s', 0):6.1f} ms) "
                    f"staleness {m['staleness_mean']:.2f} mixed {m['mixed_version_samples']}",
                    flush=True,
                )
            if t_measure is not None and time.perf_counter() - t_measure > args.max_seconds:
                print(
                    f"[trainer] stopping after {step} steps: --max-seconds {args.max_seconds} reached",
                    flush=True,
                )
                break
        t_end = time.perf_counter()
        stats1 = await client.stats()
    finally:
        try:
            await client.stop()
        except Exception as e:
            print(f"[trainer] stopping the rollout process failed: {e}", flush=True)
        publisher.close()
    measured = [r for r in rows if r["step"] > args.warmup_steps]
    if t_measure is None or not measured or stats0 is None:
        raise SystemExit("not enough steps to measure (raise --steps or lower --warmup-steps)")
    wall = t_end - t_measure
    produced = stats1["produced"] - stats0["produced"]
    k = max(1, min(10, len(rows) // 4))
    syncs = [r for r in measured if "sync_transfer_s" in r]
    result = dict(
        config=args.config,
        transport=args.transport,
        steps=len(rows),
        measured_steps=len(measured),
        wall_s=wall,
        mini_batch=args.mini_batch,
        n=args.n,
        max_tokens=args.max_tokens,
        trainer_samples_per_s=sum(args.mini_batch for _ in measured) / wall,
        rollout_samples_per_s=produced / wall,
        rollout_tokens_per_s=(stats1["generated_tokens"] - stats0["generated_tokens"]) / wall,
        sync_s_mean=statistics.mean(r["sync_s"] for r in syncs) if syncs else 0.0,
        sync_transfer_s_mean=statistics.mean(r["sync_transfer_s"] for r in syncs) if syncs else 0.0,
        sync_transfer_s_median=statistics.median(r["sync_transfer_s"] for r in syncs) if syncs else 0.0,
        sync_gbps_median=statistics.median(r["sync_gbps"] for r in syncs) if syncs else 0.0,
        first_sync_s=rows[0].get("sync_s", 0.0),
        train_s_mean=statistics.mean(r["train_s"] for r in measured),
        wait_s_mean=statistics.mean(r["wait_s"] for r in measured),
        step_s_mean=statistics.mean(r["step_s"] for r in measured),
        reward_first=statistics.mean(r["reward_mean"] for r in rows[:k]),
        reward_last=statistics.mean(r["reward_mean"] for r in rows[-k:]),
        reward_window=k,
        staleness_mean=statistics.mean(r["staleness_mean"] for r in measured),
        mixed_version_samples=sum(r["mixed_version_samples"] for r in measured),
        resumed_requests=stats1["resumed_requests"],
        aborted_syncs=stats1["aborted_syncs"],
        behaviour_proximal_abs_diff_last=rows[-1]["behaviour_proximal_abs_diff"],
        reward_curve=[round(r["reward_mean"], 4) for r in rows],
    )
    Path(args.result).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# the launcher


def role_args(args: argparse.Namespace) -> list[str]:
    keep = (
        "model_dir",
        "steps",
        "warmup_steps",
        "max_seconds",
        "mini_batch",
        "n",
        "staleness",
        "sync_every",
        "per_replica",
        "max_batch",
        "max_tokens",
        "prompt_len",
        "vocab",
        "lr",
        "seed",
        "engine_dtype",
        "bucket_mb",
        "threads",
        "log_every",
    )
    out: list[str] = []
    for k in keep:
        out += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return out


def run_config(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from arl.sync.net import free_port

    c = CONFIGS[name]
    port = free_port()
    result = work / f"{name}.json"
    common = (
        [sys.executable, str(Path(__file__).resolve())]
        + role_args(args)
        + ["--port", str(port), "--transport", c["transport"], "--config", name]
    )
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONUNBUFFERED"] = "1"

    def spawn(role: str, gpu: str, extra: list[str]) -> subprocess.Popen[bytes]:
        e = dict(env)
        if gpu:
            e["CUDA_VISIBLE_DEVICES"] = gpu
        else:
            e["CUDA_VISIBLE_DEVICES"] = ""
        return subprocess.Popen(common + ["--role", role] + (["--gpu-visible"] if gpu else []) + extra, env=e)

    print(
        f"\n=== {name}: trainer on {'GPU ' + c['trainer_gpu'] if c['trainer_gpu'] else 'CPU'}, "
        f"engine (TorchEngine, NOT vLLM) on {'GPU ' + c['rollout_gpu'] if c['rollout_gpu'] else 'CPU'}, "
        f"transport {c['transport']} ===",
        flush=True,
    )
    t0 = time.perf_counter()
    rollout = spawn("rollout", c["rollout_gpu"], [])
    trainer = spawn("trainer", c["trainer_gpu"], ["--result", str(result)])
    deadline = time.monotonic() + args.config_timeout
    try:
        while trainer.poll() is None:
            if rollout.poll() not in (None, 0):
                raise RuntimeError(f"{name}: the rollout process exited with {rollout.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: over --config-timeout {args.config_timeout}s")
            time.sleep(0.5)
        if trainer.returncode != 0:
            raise RuntimeError(f"{name}: the trainer process exited with {trainer.returncode}")
        rollout.wait(60)
    finally:
        for p in (trainer, rollout):
            if p.poll() is None:
                p.kill()
                p.wait()
    res = json.loads(result.read_text())
    res["total_s"] = time.perf_counter() - t0
    return res


def summarize(results: dict[str, dict[str, Any]]) -> None:
    print(
        "\nconfig     transport  steps  trainer samples/s  rollout samples/s  tokens/s  sync ms/step "
        "(transfer)  first sync s  reward first→last"
    )
    for name, r in results.items():
        print(
            f"{name:<10} {r['transport']:<9} {r['measured_steps']:>6} {r['trainer_samples_per_s']:>18.1f} "
            f"{r['rollout_samples_per_s']:>18.1f} {r['rollout_tokens_per_s']:>9.0f} {1e3 * r['sync_s_mean']:>12.1f} "
            f"({1e3 * r['sync_transfer_s_mean']:.1f}) {r['first_sync_s']:>13.2f}  "
            f"{r['reward_first']:.3f}→{r['reward_last']:.3f}"
        )
    if "split" in results and "colocated" in results:
        s, c = results["split"], results["colocated"]
        print(
            "speedup split/colocated: "
            f"trainer samples/s {s['trainer_samples_per_s'] / c['trainer_samples_per_s']:.2f}x, "
            f"rollout samples/s {s['rollout_samples_per_s'] / c['rollout_samples_per_s']:.2f}x"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=("launcher", "trainer", "rollout"), default="launcher")
    ap.add_argument("--configs", default="split,colocated")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--out", default="", help="launcher: write every config's result here (JSON)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=90.0, help="stop measuring after this many seconds")
    ap.add_argument("--config-timeout", type=float, default=240.0)
    ap.add_argument("--mini-batch", type=int, default=8, help="prompts (samples) per trainer step")
    ap.add_argument("--n", type=int, default=4, help="responses per prompt (GRPO group)")
    ap.add_argument("--staleness", type=float, default=2.0)
    ap.add_argument("--sync-every", type=int, default=1)
    ap.add_argument("--per-replica", type=int, default=32, help="prompts generating at once")
    ap.add_argument("--max-batch", type=int, default=256, help="TorchEngine: sequences per forward")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-dtype", default="bfloat16")
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=25)
    # set by the launcher for the role processes
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--transport", default="nccl")
    ap.add_argument("--config", default="")
    ap.add_argument("--result", default="")
    ap.add_argument("--gpu-visible", action="store_true")
    args = ap.parse_args()
    if args.role == "rollout":
        asyncio.run(rollout_main(args))
        return
    if args.role == "trainer":
        asyncio.run(trainer_main(args))
        return
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    with tempfile.TemporaryDirectory(prefix="arl-split-") as tmp:
        work = Path(tmp)
        if not args.model_dir:
            args.model_dir = str(build_model(work / "model", args))
        results: dict[str, dict[str, Any]] = {}
        failed = []
        for name in args.configs.split(","):
            try:
                results[name] = run_config(name, args, work)
            except Exception as e:
                print(f"!!! {e}", flush=True)
                failed.append(name)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))
        summarize(results)
        if failed:
            sys.exit(f"failed: {failed}")


if __name__ == "__main__":
    main()
