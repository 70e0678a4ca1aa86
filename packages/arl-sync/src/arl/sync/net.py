"""Network helpers that arl's packages share: a TCP port free for a rendezvous, and the interface a
node's address lives on (so NCCL and gloo bind the address other nodes reach, not one they guess).

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


_SIOCGIFADDR = 0x8915
# The variables naming the interface each communication library binds (NCCL's bootstrap and sockets,
# gloo's device); set from the node's address unless the user set them.
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def interface_of(address: str) -> str | None:
    """The name of this host's network interface that holds the IPv4 `address` (None: none does)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address on it
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def source_address(peer: str) -> str:
    """The local address this host sends from to reach `peer` (its route; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 1))
        return str(s.getsockname()[0])


def use_interface_of(address: str) -> str | None:
    """Make NCCL and gloo bind the interface holding `address` (the node's address as other nodes
    reach it), where the user did not choose one: sets `SOCKET_IFNAME_VARS` for this process and
    returns the interface (None for loopback or an address no interface holds: nothing is set).

    Without it both libraries pick an interface themselves: gloo the one its hostname resolves to
    (loopback on a host whose name does not resolve), NCCL the first non-loopback one, which on a
    multi-homed node need not be the one its peers can reach. Call it before the group is created.
    """
    import os

    if not address or address.startswith("127.") or address in ("localhost", "::1"):
        return None
    name = interface_of(address)
    if name is None:
        return None
    for var in SOCKET_IFNAME_VARS:
        os.environ.setdefault(var, name)
    return name
