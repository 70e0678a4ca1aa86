"""What the driver asks a cluster node before a run starts, as Ray tasks pinned to that node.

Standard library only: a probe costs a worker's start on the node, not an import of torch or the app.
`arl_train.storage` checks the paths each node needs; `arl_train.cluster` asks rank 0's node for a port.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def check_paths(needs: list[dict[str, Any]], token_file: str, token: str) -> list[str]:
    """What of `needs` (dicts of `storage.Need`) this node cannot see, one line each; [] when it sees all.

    A folder the node writes must hold the driver's probe file `token_file` with `token` (the driver's
    folder itself, not a same-named local one) and take a file; a folder it reads must exist and be
    readable."""
    problems = []
    for need in needs:
        path, what = Path(need["path"]), need["what"]
        if not path.exists():
            problems.append(f"{what} {path} does not exist there")
            continue
        if need["write"]:
            try:
                seen = (path / token_file).read_text()
            except OSError:
                seen = ""
            if seen != token:
                problems.append(
                    f"{what} {path} there is another folder than the driver's (it does not hold the "
                    f"driver's probe file {token_file})"
                )
                continue
            try:
                probe = path / f"{token_file}.{os.uname().nodename}.{os.getpid()}"
                probe.write_text("ok")
                probe.unlink()
            except OSError as exc:
                problems.append(f"{what} {path} is not writable there: {exc.strerror or exc}")
        elif path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
            problems.append(f"{what} {path} is not readable there")
    return problems


def free_port_on(host: str) -> int:
    """A TCP port free on `host` (this node's address) now; as `arl.sync.net.free_port`, without torch."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
