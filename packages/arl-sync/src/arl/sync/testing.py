"""Process entry points for multi-process tests of arl-sync (and of code that embeds it).

Run them with `multiprocessing.get_context("spawn").Process(target=...)`. They exchange results through
files written with `torch.save`, so a test compares what arrived bit for bit with what was sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from .errors import SyncError
from .receiver import WeightReceiver
from .sender import WeightSender
from .types import SyncConfig


def receiver_main(
    address: str,
    cfg: SyncConfig,
    rounds: int,
    out_path: str,
    stream: bool = False,
    die_round: int | None = None,
    die_after: int = 0,
    device: str | None = None,
    start_timeout_s: float = 60.0,
    other_host: bool = False,
    vanish: bool = False,
) -> None:
    """Receive `rounds` syncs into a dict "model" (a clone per tensor, as a real `load_weights` copies),
    then save {"model", "version", "log"} to `out_path`. `log` holds, per round, (version or None,
    error class name or ""). In round `die_round` the process exits abruptly after `die_after` tensors.
    `other_host`: appear to the sender as a process on another host (`appear_on_another_host`);
    `vanish`: after the last round, exit without leaving the group (as a lost host would)."""
    if other_host:
        appear_on_another_host()
    model: dict[str, torch.Tensor] = {}
    log: list[tuple[int | None, str]] = []

    def store(named) -> None:
        staged = {n: t.clone() for n, t in named}
        model.clear()
        model.update(staged)

    with WeightReceiver(address, cfg, device=device) as r:
        for i in range(rounds):
            try:
                if i == die_round:
                    for n, (_name, _t) in enumerate(r.iter_tensors(timeout_s=start_timeout_s)):
                        if n + 1 >= die_after:
                            os._exit(3)
                elif stream:
                    got = {n: t.clone() for n, t in r.iter_tensors(timeout_s=start_timeout_s)}
                    model.clear()
                    model.update(got)
                else:
                    r.receive(apply=store, timeout_s=start_timeout_s)
                log.append((r.version, ""))
            except SyncError as e:
                log.append((None, type(e).__name__))
        torch.save(
            {"model": {k: v.cpu() for k, v in model.items()}, "version": r.version, "log": log}, out_path
        )
        if vanish:
            os._exit(0)


def spawn_receiver(ctx: Any, address: str, cfg: SyncConfig, rounds: int, out_path: str, **kw: Any) -> Any:
    """`receiver_main` (with `kw`) started in a daemon process of the multiprocessing context `ctx`."""
    p = ctx.Process(target=receiver_main, args=(address, cfg, rounds, out_path), kwargs=kw, daemon=True)
    p.start()
    return p


def load_result(path: str) -> dict[str, Any]:
    """What `receiver_main` saved: {"model", "version", "log"}."""
    return torch.load(path, weights_only=False)


def appear_on_another_host() -> None:
    """Make this process's arl-sync sender/receiver report the pid namespace of another host, so that
    its peers cannot judge it by its pid and must see its end through the transport, as across hosts."""
    from . import receiver as receiver_module
    from . import sender as sender_module

    elsewhere = f"another-host-{os.getpid()}|pid:[0]"
    receiver_module.pid_namespace = lambda: elsewhere  # type: ignore[attr-defined]
    sender_module.pid_namespace = lambda: elsewhere  # type: ignore[attr-defined]


def dying_sender_main(
    cfg: SyncConfig, tensors_path: str, die_after: int, addr_path: str, other_host: bool = False
) -> None:
    """Send the tensors saved at `tensors_path` once as version 0, then start version 1 and exit
    abruptly after `die_after` tensors. Writes its address to `addr_path`. `other_host`: as in
    `receiver_main`."""
    if other_host:
        appear_on_another_host()
    tensors: dict[str, torch.Tensor] = torch.load(tensors_path)
    s = WeightSender(cfg, num_receivers=1)
    tmp = addr_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(s.address)
    os.rename(tmp, addr_path)
    s.send(tensors, version=0)

    def lazy() -> Iterator[tuple[str, torch.Tensor]]:
        for n, (name, t) in enumerate(tensors.items()):
            if n >= die_after:
                time.sleep(0.2)  # let the receiver take what was sent
                os._exit(4)
            yield name, t

    s.send(lazy(), version=1)


def wait_for_file(path: str, timeout_s: float) -> str:
    """The contents of `path` once it exists (polling), or TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s}s")
        time.sleep(0.02)
    with open(path) as f:
        return f.read()


def make_tensors(round_: int, dtype_mix: bool = True) -> dict[str, torch.Tensor]:
    """Different contents every round; tiny, odd-sized, larger-than-a-bucket, several dtypes."""
    g = torch.Generator().manual_seed(1000 + round_)
    out: dict[str, torch.Tensor] = {
        "embed.weight": torch.randn(301, 97, generator=g).to(torch.bfloat16),  # 58 KB, straddles
        "big.weight": torch.randn(70_001, generator=g),  # 280 KB > 4 buckets
        "big.int64": torch.randint(-(2**62), 2**62, (20_003,), generator=g, dtype=torch.int64),
        "odd.fp32": torch.randn(3, 5, 7, generator=g),
        "odd.half": torch.randn(11, generator=g).half(),
        "scalar": torch.tensor(float(round_) + 0.25),
        "empty": torch.empty(0, 4),
        "transposed": torch.randn(13, 9, generator=g).t(),
    }
    if dtype_mix:
        out["mask.bool"] = torch.rand(37, generator=g) > 0.5
        out["q.int8"] = torch.randint(-128, 127, (29,), generator=g, dtype=torch.int8)
        out["f64"] = torch.randn(5, generator=g, dtype=torch.float64)
    for i in range(300):  # many tiny tensors
        out[f"tiny.{i}"] = torch.randn(1 + i % 7, generator=g)
    return out


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Same names, dtypes, shapes and bits."""
    assert set(got) == set(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and g.shape == w.shape, k
        assert torch.equal(
            g.view(torch.uint8) if g.dtype == torch.bool else g,
            w.contiguous().view(torch.uint8) if w.dtype == torch.bool else w,
        ), k


# ---- the "sender writes into the receiver's staging" protocol on the CPU, in one process ----------

_DIRECT_BUFFERS: dict[int, torch.Tensor] = {}


class DirectSender:
    """The protocol of the one-copy "cuda_ipc" transport (receivers export their staging buffer, the
    sender writes every bucket straight into it, data complete at `End`) over plain host memory of
    one process: receivers run in threads and "export" by registering their buffer here. Lets CPU
    tests drive the real `WeightSender` / `WeightReceiver` through that path; install it with
    `use_direct_transport(monkeypatch)`."""

    needs_acks = False
    wants_staging = True
    lands_at_end = True

    def __init__(self, cfg: SyncConfig, device: torch.device | None) -> None:
        from .plan import PackCache

        self._mapped: dict[bytes, tuple[int, torch.Tensor]] = {}
        self._targets: list[torch.Tensor] = []
        self._packs = PackCache()
        self.handles_opened = 0

    def welcome_info(self, hello_device: str) -> bytes:
        return b""

    def begin(self, member_ids) -> dict[bytes, bytes]:
        self._targets = []
        return {}

    def attach(self, infos: dict[bytes, bytes]) -> None:
        import pickle

        self._targets = []
        for ident, info in infos.items():
            generation, capacity, key = pickle.loads(info)
            m = self._mapped.get(ident)
            if m is None or m[0] != generation:
                m = self._mapped[ident] = (generation, _DIRECT_BUFFERS[key][:capacity])
                self.handles_opened += 1
            self._targets.append(m[1])
        self._packs.start(self._targets)

    def connect(self, timeout_s: float) -> None:
        pass

    def wait_slot(self, slot: int, timeout_s: float, check) -> None:
        pass

    def pack(self, slot: int, chunks, base: int = 0, stable: bool = False) -> None:
        from .errors import TransportError
        from .plan import pack_chunks

        if not chunks:
            return
        end = base + max(c.hi for c in chunks)
        for t in self._targets:
            if end > t.numel():
                raise TransportError(f"the stream outgrew a receiver's staging buffer ({end} > {t.numel()})")
        if stable:
            self._packs.pack(chunks, base, end)
            return
        for t in self._targets:
            pack_chunks(t[base:end], chunks)

    def post(self, slot: int, nbytes: int) -> None:
        pass

    def finish(self, timeout_s: float, check) -> None:
        pass

    def abort(self) -> None:
        self._targets = []

    def close(self) -> None:
        self._mapped.clear()


class DirectReceiver:
    """Receiver side of `DirectSender`: exports its staging buffer (re-exported when reallocated)."""

    needs_acks = False
    lands_at_end = True

    def __init__(self, cfg: SyncConfig, device: torch.device, info: bytes) -> None:
        self._exported: tuple[int, int] | None = None
        self._info = b""
        self._generation = 0

    def begin(self, info: bytes, timeout_s: float) -> None:
        pass

    def export(self, staging: torch.Tensor) -> bytes:
        import pickle

        key = (staging.data_ptr(), staging.numel())
        if self._exported != key:
            self._generation += 1
            _DIRECT_BUFFERS[id(staging)] = staging
            self._info = pickle.dumps((self._generation, staging.numel(), id(staging)))
            self._exported = key
        return self._info

    def fetch(self, slot: int, nbytes: int, dst: torch.Tensor) -> None:
        pass

    def wait(self, timeout_s: float, check) -> None:
        pass

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


def use_direct_transport(monkeypatch) -> None:
    """Make every sender/receiver built afterwards (in this process) use `DirectSender`/`DirectReceiver`."""
    from . import receiver as receiver_module
    from . import sender as sender_module

    monkeypatch.setattr(
        sender_module, "make_sender_transport", lambda cfg, dev, host="": DirectSender(cfg, dev)
    )
    monkeypatch.setattr(
        receiver_module,
        "make_receiver_transport",
        lambda cfg, dev, info, peer="": DirectReceiver(cfg, dev, info),
    )
