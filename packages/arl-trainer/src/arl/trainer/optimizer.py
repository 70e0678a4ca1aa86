"""The optimizer both backends build (AdamW, fused on CUDA when asked) and, optionally, where its state
lives between trainer steps.

`optimizer_offload = true` keeps AdamW's state (two fp32 moments per parameter: half the trainer's
memory under mixed precision) in pinned host memory between trainer steps (one `HostArena` of exactly
the state's size, not a rounded-up pinned block per tensor). `HostOptimizerState`
copies every CUDA state tensor out and frees its storage after a step, and before the next step's
first `optimizer.step()` gives each tensor its storage back and copies the values in. The tensors
themselves (and their DTensor wrappers under FSDP2) stay the optimizer's, so nothing else changes:
the update is bit-identical. Between steps the trainer then holds only its parameters (gradients are
dropped after the step), which is what lets a colocated vLLM replica take the memory back for its KV
cache. The cost is the state's bytes over PCIe twice per step; the way back can be hidden: `prefetch()`
starts it on a copy stream of its own when the step's first forward begins, so it runs beside the
forward and backward passes and the update waits only for what is left (the peak of those passes
then includes the state, as it would without the offload).

The prefetch is paced: a thread of its own queues the copies in groups, keeping at most
`inflight_bytes` queued, the next group as an earlier one lands. Anything that synchronizes the whole
device mid-step then waits for that much copying, not for the whole state. The first launch of a
kernel for a new matmul shape does (the colocated 8B app on an H200, its batch's length new every
step: the head's first backward matmul held the host 780 ms, the compute stream idle, until the 1,194
queued copies had landed; `CUDA_MODULE_LOADING=EAGER` did not avoid it), and so does cudaFree.

The way out can overlap too (`offload(overlap=True)`): the same pacing thread queues the copies to the
host and `offload` returns at once; the state's GPU storage is freed by `settle()`, which the caller
runs once it needs that memory, and which anything touching the state next runs first. The colocated
app settles just before the replica's KV cache wakes, so the copies run beside the replica's weight
wake and the weight sync instead of before them.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import torch

from arl.trainer.config import OptimConfig
from arl.trainer.host_arena import HostArena


def make_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimConfig, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW from `config`; `config.fused` uses the single-kernel CUDA implementation (no full-size
    temporaries in the step, unlike the default multi-tensor one) where the parameters are on CUDA."""
    fused = config.fused and device.type == "cuda"
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=config.betas,
        weight_decay=config.weight_decay,
        **({"fused": True} if fused else {}),
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns the memory (a DTensor's local shard)."""
    return t.to_local() if hasattr(t, "to_local") else t


#: How long `load()` and `settle()` wait for the pacing thread to queue every copy before they call it hung.
PACER_JOIN_TIMEOUT_S = 600.0


def copy_groups(nbytes: Sequence[int], group_bytes: int) -> list[range]:
    """Consecutive index ranges of tensors whose sizes are `nbytes`, each reaching `group_bytes` (a
    larger tensor alone; the last group what is left). `group_bytes <= 0`: one group of everything."""
    if group_bytes <= 0:
        return [range(len(nbytes))] if nbytes else []
    groups, start, size = [], 0, 0
    for index, n in enumerate(nbytes):
        size += n
        if size >= group_bytes:
            groups.append(range(start, index + 1))
            start, size = index + 1, 0
    if start < len(nbytes):
        groups.append(range(start, len(nbytes)))
    return groups


class HostOptimizerState:
    """An optimizer's CUDA state tensors moved to pinned host memory and back (see the module docstring)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, *, device_type: str = "cuda", inflight_bytes: int = 256 << 20
    ) -> None:
        """`device_type`: where the state to move lives (the backends: "cuda"; the CPU tests move CPU
        state to other CPU buffers, which exercises the same freeing and restoring). `inflight_bytes`:
        the prefetch's pace, the most bytes of copies queued at once (0: all at once)."""
        self.optimizer = optimizer
        self.device_type = device_type
        self.inflight_bytes = inflight_bytes
        self._pacer: threading.Thread | None = (
            None  # queues a paced prefetch's (or an overlapped offload's) copies
        )
        self._pacer_error: BaseException | None = None
        self._pacer_join_s = 0.0  # the host's wait in load() for the pacer to queue the last copies
        self._offloaded: list[tuple[torch.Tensor, torch.Tensor]] = []  # (state tensor, its host copy)
        self._arena: HostArena | None = None  # the host copies, one exact-size buffer, reused
        self._copy_stream: torch.cuda.Stream | None = None  # the state's copies', created on first use
        self._incoming: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # a prefetch's start/end
        self._outgoing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # an overlapped offload's
        self._settle_s = 0.0  # the host's wait in the last settle()
        self._wait: tuple[torch.cuda.Event, torch.cuda.Event] | None = None  # the update's wait for it
        self._cpu_load_s = 0.0  # device_type "cpu": the copies are synchronous, timed on the host
        self.on_host = False
        self.prefetching = False
        self.leaving = False  # an overlapped offload's copies queued, the GPU storage not yet freed

    def _device_state(self) -> list[tuple[str, torch.Tensor]]:
        out = []
        for index, state in enumerate(self.optimizer.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and _local(value).device.type == self.device_type:
                    out.append((f"state[{index}][{key!r}]", _local(value)))
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of state the last offload moved."""
        return sum(host.numel() * host.element_size() for _, host in self._offloaded)

    def offload(self, *, overlap: bool = False) -> int:
        """Copy the CUDA state to host memory and free its GPU storage; returns the bytes moved.
        `overlap` (CUDA): queue the copies, paced, on the copy stream and return at once; `settle()`
        frees the storage once they have landed."""
        self.settle()
        if self.on_host:
            return 0
        tensors = self._device_state()
        pinned = self.device_type == "cuda"
        for name, t in tensors:
            if (
                not t.is_contiguous()
                or t.storage_offset() != 0
                or t.untyped_storage().nbytes() != t.numel() * t.element_size()
            ):
                raise ValueError(
                    f"optimizer {name} does not own its storage alone (a view or a strided tensor): "
                    "optimizer_offload cannot free it"
                )
        specs = [(tuple(t.shape), t.dtype) for _, t in tensors]
        if self._arena is None or not self._arena.holds(specs):
            self._offloaded, self._arena = [], None  # the old layout's memory goes before the new is taken
            self._arena = HostArena(specs, pinned=pinned)
        self._offloaded = list(zip((t for _, t in tensors), self._arena.views, strict=True))
        self.on_host = True
        if pinned and overlap:
            self._outgoing = self._start_copies([(host, t) for t, host in self._offloaded])
            self.leaving = True
            return self.nbytes
        for t, host in self._offloaded:
            host.copy_(t, non_blocking=True)
        if pinned:
            torch.cuda.current_stream().synchronize()  # every copy landed before its source is freed
        self._free_device_storage()
        return self.nbytes

    def _free_device_storage(self) -> None:
        for t, _ in self._offloaded:
            t.untyped_storage().resize_(0)

    def settle(self) -> float:
        """Finish an overlapped offload: wait for its copies to land, then free the state's GPU storage
        (into the caching allocator: `torch.cuda.empty_cache()` hands it to the driver). Returns the
        seconds the host waited; 0 when no offload was under way."""
        if not self.leaving:
            return 0.0
        t0 = time.perf_counter()
        self.leaving = False
        try:
            self._join_pacer()
            assert self._outgoing is not None
            self._outgoing[1].synchronize()
        except BaseException:
            self.on_host = False  # the host copy is incomplete; the GPU storage, still held, has the state
            raise
        self._free_device_storage()
        self._settle_s = time.perf_counter() - t0
        return self._settle_s

    def offload_times(self) -> tuple[float, float]:
        """Of the last overlapped offload, once settled: (seconds its copies took, seconds `settle()`
        waited for them). (0, 0) for an offload that was not overlapped (its call's time is the cost)."""
        if self._outgoing is None or self.leaving:
            return 0.0, 0.0
        return self._outgoing[0].elapsed_time(self._outgoing[1]) / 1e3, self._settle_s

    def prefetch(self) -> None:
        """Start the state's way back: every tensor gets its storage now and its values are copied in on
        the copy stream, beside whatever the compute stream runs next; `load()` makes the compute stream
        wait for them. A no-op unless the state is on the host and not already coming back."""
        self.settle()
        if not self.on_host or self.prefetching:
            return
        for t, host in self._offloaded:
            t.untyped_storage().resize_(host.numel() * host.element_size())
        self.prefetching = True
        if self.device_type != "cuda":
            t0 = time.perf_counter()
            for t, host in self._offloaded:
                t.copy_(host)
            self._cpu_load_s = time.perf_counter() - t0
            return
        self._incoming = self._start_copies(self._offloaded)

    def _start_copies(
        self,
        pairs: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        """Queue `dst.copy_(src)` for each (dst, src) on the copy stream, paced by a thread unless
        `inflight_bytes` is 0; returns the events recorded before the first copy and after the last."""
        compute = torch.cuda.current_stream()
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=compute.device)
        # The copies start after the compute stream's queued work: a prefetch's fresh storage may be
        # blocks it freed and still has kernels queued on; an offload's sources are the update's output.
        self._copy_stream.wait_stream(compute)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(self._copy_stream)
        if self.inflight_bytes <= 0:
            self._queue_copies(pairs, end)
            return start, end
        # Two groups of half the pace in flight: one lands while the next is queued behind it.
        sizes = [src.numel() * src.element_size() for _, src in pairs]
        groups = [[pairs[i] for i in g] for g in copy_groups(sizes, self.inflight_bytes // 2)]
        self._pacer_error = None
        self._pacer = threading.Thread(
            target=self._paced_copies, args=(groups, end), daemon=True, name="arl-optimizer-copies"
        )
        self._pacer.start()
        return start, end

    def _queue_copies(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], landed: torch.cuda.Event) -> None:
        assert self._copy_stream is not None
        with torch.cuda.stream(self._copy_stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
            landed.record()

    def _paced_copies(
        self, groups: list[list[tuple[torch.Tensor, torch.Tensor]]], end: torch.cuda.Event
    ) -> None:
        """The pacing thread: queue each group once at most one earlier group is still in flight."""
        try:
            queued: collections.deque[torch.cuda.Event] = collections.deque()
            for group in groups:
                if len(queued) == 2:
                    queued.popleft().synchronize()  # (releases the GIL; blocking: no spinning core)
                queued.append(torch.cuda.Event(blocking=True))
                self._queue_copies(group, queued[-1])
            end.record(self._copy_stream)
        except BaseException as error:  # re-raised by load(), on the trainer's thread
            self._pacer_error = error

    def _join_pacer(self) -> float:
        """Wait for the pacing thread to have queued every copy; returns the seconds the host waited."""
        if self._pacer is None:
            return 0.0
        t0 = time.perf_counter()
        self._pacer.join(PACER_JOIN_TIMEOUT_S)
        waited = time.perf_counter() - t0
        if self._pacer.is_alive():
            raise RuntimeError(
                f"optimizer_offload: the state's copies had not all been queued after "
                f"{PACER_JOIN_TIMEOUT_S:.0f} s"
            )
        self._pacer = None
        if self._pacer_error is not None:
            raise RuntimeError("optimizer_offload: the state's copies failed") from self._pacer_error
        return waited

    def load(self) -> int:
        """The state on the GPU for the compute stream's next kernels (prefetched or not): the compute
        stream waits for the copies, the host does not. Returns the bytes."""
        if not self.on_host:
            return 0
        self.prefetch()
        # Every copy queued (all but the last group's landed) before the compute stream waits for the end.
        self._pacer_join_s = self._join_pacer()
        if self._incoming is not None:
            compute = torch.cuda.current_stream()
            before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            before.record(compute)
            compute.wait_event(self._incoming[1])
            after.record(compute)
            self._wait = (before, after)
        self.on_host = self.prefetching = False
        return self.nbytes

    def load_times(self) -> tuple[float, float]:
        """Of the last `load()`: (seconds the copies took, seconds the update waited for them: the host's
        wait for a paced prefetch's last copies to be queued plus the compute stream's for them to land;
        0 when a prefetch hid them all). Waits for both to be known."""
        if self._incoming is None or self._wait is None:
            return self._cpu_load_s, 0.0
        self._wait[1].synchronize()
        waited = self._pacer_join_s + self._wait[0].elapsed_time(self._wait[1]) / 1e3
        return self._incoming[0].elapsed_time(self._incoming[1]) / 1e3, waited

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The state on the GPU inside the block (checkpoint save / load); back to the host after if it was there."""
        was_on_host = self.on_host
        self.load()
        try:
            yield
        finally:
            if was_on_host:
                self.offload()
