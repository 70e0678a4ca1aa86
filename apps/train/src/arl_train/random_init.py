"""Random weights for the large built-in shapes (`builtin:qwen3-8b-random` and friends), fast.

transformers' own initialisation of a ~7B model on the CPU took 4 minutes on the GPU machines, most
of an app run's start (for the 1.7B body on their 16 cores: 57.7 s against this module's 3.5 s).
These shapes exist for throughput measurements, so here the
model is built on the meta device (nothing drawn), given empty CPU storage, and every tensor is
filled once, as transformers' init would fill it for a Qwen3 body — linear and embedding weights
N(0, initializer_range) with the padding row zeroed, norm weights 1, biases 0 — chunk by chunk on every
core. Each chunk has its own generator seeded from (seed, tensor, chunk), so the same seed gives the
same weights whatever the number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

#: Elements per chunk: one thread's unit of work.
CHUNK = 1 << 24


def _chunk_seed(seed: int, tensor_index: int, chunk_index: int) -> int:
    return (seed * 1_000_003 + tensor_index) * 1_000_033 + chunk_index


def _draw(flat: torch.Tensor, start: int, stop: int, std: float, seed: int) -> None:
    flat[start:stop].normal_(0.0, std, generator=torch.Generator().manual_seed(seed))


def random_causal_lm(
    model_class: Any, config: Any, dtype: torch.dtype, seed: int, threads: int | None = None
):
    """`model_class(config)` in `dtype` on the CPU with freshly drawn weights (see the module docstring)."""
    with torch.device("meta"):
        model = model_class._from_config(config, dtype=dtype)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave the tied embedding and LM head separate storage
    std = float(config.initializer_range)
    jobs = []
    for index, (name, param) in enumerate(model.named_parameters()):
        data = param.data
        if "norm" in name:
            data.fill_(1.0)
        elif name.endswith(".bias"):
            data.zero_()
        else:
            flat = data.view(-1)
            jobs += [
                (flat, s, min(s + CHUNK, flat.numel()), std, _chunk_seed(seed, index, s // CHUNK))
                for s in range(0, flat.numel(), CHUNK)
            ]
    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:  # torch releases the GIL while drawing
        for future in [pool.submit(_draw, *job) for job in jobs]:
            future.result()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    return model
