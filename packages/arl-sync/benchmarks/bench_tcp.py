"""The "tcp" transport against the link: a full sync of a Qwen2.5-0.5B-shaped state dict between two
network namespaces joined by a veth pair, against a bare socket copy of the same bytes over the same
link, measured in the same run (an iperf-like sender of one preallocated buffer, `sendall` in
bucket-sized pieces, into a receiver's preallocated buffer with `recv_into`).

    sudo uv run python packages/arl-sync/benchmarks/bench_tcp.py [--buckets 4,16,64] [--rounds 5]
    uv run python packages/arl-sync/benchmarks/bench_tcp.py --loopback     # no root: both on 127.0.0.1

Each side runs in its own process (with `--loopback` in this machine's namespace, otherwise the
sender in namespace A at 10.213.250.1 and the receiver in B at 10.213.250.2, made and removed here;
nothing else is reachable from them). A sync is timed on the sender from the first tensor to the
receiver's confirmation, staging included, apply excluded; the bare copy from its first byte to the
receiver's one-byte answer after the last. Best and median of `--rounds` after one warm-up each.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MiB = 1 << 20
SUBNET = "10.213.250"
SYNC_PORT, RAW_PORT = 29411, 29412


def _state_dict(scale: float, dtype: str):
    import torch
    from model_shapes import make_state_dict

    return make_state_dict(getattr(torch, dtype), scale=scale)


def raw_send(host: str, nbytes: int, piece: int, rounds: int) -> list[float]:
    """Bare copies of `nbytes` to the raw receiver; GB/s of each round (the first is a warm-up)."""
    buf = memoryview(bytearray(os.urandom(nbytes)))
    rates = []
    with _dial(host, RAW_PORT) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds + 1):
            t = time.perf_counter()
            for lo in range(0, nbytes, piece):
                s.sendall(buf[lo : lo + piece])
            if s.recv(1) != b"k":
                raise RuntimeError("the raw receiver did not confirm")
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
    return rates[1:]


def _dial(host: str, port: int, timeout_s: float = 120.0) -> socket.socket:
    """Connect, retrying while the other side (still importing torch) does not listen yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=60)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def raw_recv(host: str, nbytes: int, rounds: int) -> None:
    buf = memoryview(bytearray(nbytes))
    with socket.create_server((host, RAW_PORT)) as srv:
        conn, _ = srv.accept()
        with conn:
            for _ in range(rounds + 1):
                got = 0
                while got < nbytes:
                    k = conn.recv_into(buf[got:], nbytes - got)
                    if not k:
                        raise RuntimeError("the raw sender closed early")
                    got += k
                conn.sendall(b"k")


def sender(args: argparse.Namespace) -> None:
    import torch

    from arl.sync import SyncConfig, WeightSender

    torch.set_num_threads(1)
    sd = _state_dict(args.scale, args.dtype)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    out: dict = {"tensors": len(sd), "bytes": nbytes, "raw": {}, "sync": {}}
    for mb in args.bucket_list:
        out["raw"][mb] = raw_send(args.peer, nbytes, mb * MiB, args.rounds)
        cfg = SyncConfig(transport="tcp", bucket_bytes=mb * MiB, timeout_s=120)
        with WeightSender(cfg, num_receivers=1, host=args.host, port=SYNC_PORT + mb) as s:
            first = s.send(sd, version=0)
            rates = [s.send(sd, version=v).gbps for v in range(1, args.rounds + 1)]
        out["sync"][mb] = {"first": first.gbps, "rates": rates}
    print("RESULT " + json.dumps(out), flush=True)


def receiver(args: argparse.Namespace) -> None:
    import torch

    from arl.sync import SyncConfig, WeightReceiver

    torch.set_num_threads(1)
    sd = _state_dict(args.scale, args.dtype)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    for mb in args.bucket_list:
        raw_recv(args.host, nbytes, args.rounds)
        cfg = SyncConfig(transport="tcp", bucket_bytes=mb * MiB, timeout_s=120)
        with WeightReceiver(f"tcp://{args.peer}:{SYNC_PORT + mb}", cfg) as r:
            for _ in range(args.rounds + 1):
                r.receive(timeout_s=120)


def _ns(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", default="4,16,64", help="bucket sizes in MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the 24 layers")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--loopback", action="store_true", help="both sides on 127.0.0.1 (no namespaces, no root)"
    )
    ap.add_argument("--role", choices=["send", "recv"], help=argparse.SUPPRESS)
    ap.add_argument("--host", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.bucket_list = [int(x) for x in args.buckets.split(",")]
    if args.role == "send":
        return sender(args)
    if args.role == "recv":
        return receiver(args)
    me = [
        sys.executable,
        os.path.abspath(__file__),
        "--buckets",
        args.buckets,
        "--rounds",
        str(args.rounds),
        "--scale",
        str(args.scale),
        "--dtype",
        args.dtype,
    ]
    names: list[str] = []
    try:
        if args.loopback:
            a = b = "127.0.0.1"
            wrap_send: list[str] = []
            wrap_recv: list[str] = []
            link = "loopback"
        else:
            a, b = f"{SUBNET}.1", f"{SUBNET}.2"
            tag = f"arlbench-{os.getpid()}"
            names = [f"{tag}-a", f"{tag}-b"]
            for n in names:
                _ns("netns", "add", n)
            _ns(
                "-n",
                names[0],
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                names[1],
            )
            for n, ip in zip(names, (a, b)):
                _ns("-n", n, "addr", "add", f"{ip}/24", "dev", "eth0")
                _ns("-n", n, "link", "set", "eth0", "up")
                _ns("-n", n, "link", "set", "lo", "up")
            wrap_send = ["ip", "netns", "exec", names[0]]
            wrap_recv = ["ip", "netns", "exec", names[1]]
            link = "veth between two network namespaces"
        recv = subprocess.Popen(wrap_recv + me + ["--role", "recv", "--host", b, "--peer", a])
        done = subprocess.run(
            wrap_send + me + ["--role", "send", "--host", a, "--peer", b],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        recv.wait(120)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"the sender failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        res = json.loads(line.removeprefix("RESULT "))
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
    print(
        f"state dict: {res['tensors']} tensors, {res['bytes'] / 1e9:.3f} GB ({args.dtype}); link: {link}; "
        f"cores={os.cpu_count()}"
    )
    print(
        f"{'bucket MiB':>10} {'bare copy GB/s':>15} {'sync best':>10} {'median':>8} "
        f"{'best/bare':>10} {'first sync':>10}"
    )
    for mb in args.bucket_list:
        raw = max(res["raw"][str(mb)])
        rates = res["sync"][str(mb)]["rates"]
        print(
            f"{mb:>10} {raw:>15.2f} {max(rates):>10.2f} {statistics.median(rates):>8.2f} "
            f"{max(rates) / raw:>9.0%} {res['sync'][str(mb)]['first']:>10.2f}"
        )


if __name__ == "__main__":
    main()
