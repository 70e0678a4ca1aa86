"""Batch assembly cost on long samples: `assemble_batch` on the queue's packed arrays vs a per-token loop.

Times, in one run, on the same decoded samples (queue schema 5: per-token fields are packed arrays):
- frombuffer: `arl.trainer.batch.assemble_batch` (rows filled from `torch.frombuffer` views);
- per_token_loop: the assembly as it was written for list fields (a Python loop per token, kept here
  as the baseline), on the same samples;
and checks that both give identical tensors. CPU only, one thread. Prints one JSON block; writes it to
$OUT/assemble_batch.json when $OUT is set.

    uv run python packages/arl-trainer/benchmarks/assemble_batch.py --tokens 4096 32768 --samples 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[3]
for _src in ("packages/arl-trainer/src", "packages/arl-queue/src"):
    if str(_ROOT / _src) not in sys.path:
        sys.path.insert(0, str(_ROOT / _src))

# After the sys.path set-up above, which lets the script run without the workspace installed.
from arl.queue import Response, Sample, decode_sample, encode_sample, iter_segment_rows  # noqa: E402
from arl.trainer.batch import TrainBatch, assemble_batch  # noqa: E402


def per_token_loop(samples: list[Sample], pad_token_id: int) -> TrainBatch:
    """The list-era assembly: every row built token by token as Python lists, then one torch.tensor."""
    rows, rewards, groups, lens, trajs = [], [], [], [], []
    for item in iter_segment_rows(samples):
        seg = item.row
        p = len(seg.prompt_ids)
        ids = list(seg.prompt_ids) + list(seg.response_ids)
        mask = [0.0] * p + [float(m) for m in seg.response_mask]
        behaviour = [0.0] * p + [lp if m else 0.0 for lp, m in zip(seg.response_logprobs, seg.response_mask)]
        versions = [-1] * p + [v if m else -1 for v, m in zip(seg.weight_versions, seg.response_mask)]
        rows.append((ids, [1] * len(ids), mask, behaviour, versions))
        rewards.append(item.reward)
        groups.append(item.group)
        lens.append(len(seg.response_ids))
        trajs.append(item.trajectory)
    width = max(len(r[0]) for r in rows)

    def pad(column: int, value: float, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r[column] + [value] * (width - len(r[column])) for r in rows], dtype=dtype)

    return TrainBatch(
        input_ids=pad(0, pad_token_id, torch.long),
        attention_mask=pad(1, 0, torch.long),
        loss_mask=pad(2, 0.0, torch.float32),
        behaviour_logp=pad(3, 0.0, torch.float32),
        token_versions=pad(4, -1, torch.long),
        rewards=torch.tensor(rewards),
        group_index=torch.tensor(groups),
        response_lengths=torch.tensor(lens),
        trajectory_index=torch.tensor(trajs),
    )


def make_sample(tokens: int, n: int, rng: random.Random, index: int) -> Sample:
    per = max(1, tokens // n)
    responses = [
        Response(
            response_ids=[rng.randrange(150_000) for _ in range(per)],
            response_mask=[rng.random() < 0.9 for _ in range(per)],
            response_logprobs=[-rng.random() * 5 for _ in range(per)],
            weight_versions=[7] * per,
            reward=float(i % 2),
        )
        for i in range(n)
    ]
    return Sample(
        uid=f"s{index}",
        prompt_ids=[rng.randrange(150_000) for _ in range(256)],
        responses=responses,
        start_version=7,
        end_version=7,
    )


def _ms(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return round((time.perf_counter() - start) / repeats * 1e3, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[4096, 32768], help="response tokens per sample"
    )
    parser.add_argument("--n", type=int, default=8, help="responses per sample")
    parser.add_argument("--samples", type=int, default=4, help="samples per batch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    rows = []
    for tokens in args.tokens:
        samples = [
            decode_sample(encode_sample(make_sample(tokens, args.n, rng, i))) for i in range(args.samples)
        ]
        fast, slow = assemble_batch(samples, 0), per_token_loop(samples, 0)
        same = all(
            torch.equal(getattr(fast, f), getattr(slow, f).to(getattr(fast, f).dtype))
            for f in TrainBatch.__dataclass_fields__
        )
        t_fast = _ms(lambda batch=samples: assemble_batch(batch, 0), args.repeats)
        t_slow = _ms(lambda batch=samples: per_token_loop(batch, 0), args.repeats)
        row = {
            "tokens_per_sample": tokens,
            "samples": args.samples,
            "frombuffer_ms": t_fast,
            "per_token_loop_ms": t_slow,
            "speedup": round(t_slow / t_fast, 1),
            "identical": same,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"bench": "arl-trainer assemble_batch", "n": args.n, "rows": rows}
    print(json.dumps(result, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "assemble_batch.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
