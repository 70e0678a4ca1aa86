"""One trainer step under torch.profiler: where that step's time goes.

Host ops and, on CUDA, every kernel and copy with its stream are recorded. Two files in the given
folder: `step_N.txt`, the ops by their own device time (host time on the CPU), and `step_N.json`, the
Chrome trace (open it in Perfetto) that shows which stream waited for what. The app records a whole
step of trainer rank 0 with it (`trainer.profile_step`); the benchmarks a `train_step`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def profiled_step(out_dir: Path, step: int, row_limit: int = 60) -> Iterator[None]:
    """Profile the block as trainer step `step`; writes the table and the trace when it ends."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
        if cuda:
            torch.cuda.synchronize()  # the step's last kernels inside the record
    out_dir.mkdir(parents=True, exist_ok=True)
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    (out_dir / f"step_{step}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=row_limit))
    prof.export_chrome_trace(str(out_dir / f"step_{step}.json"))
