"""One agent session: its unguessable id, its trajectory builder, its turn lock and its end-of-session state."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from arl.proxy.trajectory import TrajectoryBuilder


def new_session_id() -> str:
    """192 random bits, URL-safe: a session id is also the agent's only credential for its session."""
    return secrets.token_urlsafe(24)


@dataclass
class Session:
    """State of one session; turns are serialized by `lock`."""

    id: str
    builder: TrajectoryBuilder
    trajectory_dir: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    closed_reason: str | None = None
    consecutive_no_tool: int = 0
