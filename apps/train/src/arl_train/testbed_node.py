"""PID 1 of one test-bed node: make the node's own filesystem view, then run its Ray node and reap.

Started by `arl_train.testbed` inside fresh mount, UTS, IPC and PID namespaces (`unshare`) and the
node's network namespace. Before starting the command it gives the node what a host of its own has:

- the machine's files read-only (the software every node of a cluster has installed), except the
  Python environment the node runs (writable, as a host's own installation is: its bytecode cache),
- its own empty `/tmp` and `/dev/shm` (tmpfs), its own hostname, and an `/etc/hosts` naming every
  node of the bed,
- the declared shared folder, read-write at the same path on every node (what NFS would give), even
  where that path lies under `/tmp`; so are the software folders (the environment, the checkout).

Then it runs the command (a `ray start --block`), reaps every orphan of the namespace (it is their
init), forwards SIGTERM/SIGINT to the command, and exits with the command's code: the kernel then ends
every process left in the namespace, so nothing of the node outlives it.

A plain script (standard library only), run by the interpreter of the environment the nodes use.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2) itself: `/proc/self/cwd` as a source must be followed by the kernel, not resolved to a
    path by mount(8) (the path is hidden by then)."""

    def encode(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    if _libc.mount(encode(source), target.encode(), encode(fstype), flags, encode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def make_view(
    shared: str, hostname: str, writable: list[str] = (), hosts: str = "", software: list[str] = ()
) -> None:
    """The node's filesystem and name (module docstring); run as PID 1 of its namespaces. `writable`:
    software folders that stay writable (the Python environment, whose bytecode cache a host's own
    installation would keep); `software`: folders the node runs code from (a checkout), read-only. Those
    that lie under /tmp or /dev/shm are bound back over the node's own empty ones."""
    os.chdir(shared)  # holds the shared folder while /tmp may be covered
    if hosts:  # the bed's names, as a cluster's DNS would resolve them (bound before /tmp is covered)
        _mount(hosts, "/etc/hosts", None, MS_BIND)
    for path in writable:  # its own bind first: it keeps its flags when / turns read-only
        _mount(path, path, None, MS_BIND)
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    covered = [p for p in (*writable, *software) if p.startswith(("/tmp/", "/dev/shm/"))]
    held = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in covered}  # reachable once covered
    for private in ("/tmp", "/dev/shm"):
        _mount("tmpfs", private, "tmpfs", 0, "mode=1777")
    for path, fd in held.items():
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        os.close(fd)
    os.makedirs(shared, exist_ok=True)  # needed when the shared path lies under /tmp
    _mount("/proc/self/cwd", shared, None, MS_BIND)
    _mount(None, shared, None, MS_REMOUNT | MS_BIND)  # a bind of a read-only tree is read-only too
    os.chdir("/")
    os.makedirs(os.environ.get("HOME", "/tmp/home"), exist_ok=True)
    socket.sethostname(hostname)


def run_as_init(command: list[str]) -> int:
    """Run `command`, reaping every process of the namespace, until it exits; its exit code."""
    child = subprocess.Popen(command)

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return child.returncode if child.returncode is not None else 1
        except InterruptedError:
            continue
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PID 1 of an arl test-bed node")
    parser.add_argument("--shared", required=True, help="the folder shared by every node (absolute)")
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--writable", action="append", default=[], help="a software folder left writable")
    parser.add_argument("--software", action="append", default=[], help="a folder the node runs code from")
    parser.add_argument("--hosts", default="", help="a hosts file naming every node, bound on /etc/hosts")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the node's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if os.getpid() != 1 or not command:
        parser.error("must run as PID 1 of a new PID namespace, with a command after --")
    make_view(
        os.path.abspath(args.shared),
        args.hostname,
        [os.path.abspath(p) for p in args.writable],
        args.hosts,
        [os.path.abspath(p) for p in args.software],
    )
    print(f"arl-testbed-node {args.hostname}: view ready", flush=True)
    return run_as_init(command)


if __name__ == "__main__":
    sys.exit(main())
