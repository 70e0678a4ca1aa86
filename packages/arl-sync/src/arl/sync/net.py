"""Network helpers that arl's packages share: a TCP port free for a rendezvous.

Lives in arl-sync because it is the lowest package every user of it depends on (arl-trainer's
torch.distributed rendezvous, apps/train's placement, the benchmarks that start process groups).
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now ("" = every interface), e.g. for rank 0 of a process group.

    The port is released before returning, so another process may take it before the caller binds
    it: use it for rendezvous that bind soon after; servers that can bind port 0 themselves should.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
