"""The app's configuration error: one type for every refused value, naming its dotted key."""

from __future__ import annotations

import re
from collections.abc import Collection


class ConfigError(ValueError):
    """The configuration file, an override or a combination of values is invalid.

    `key` is the dotted key at fault (e.g. `actor.loss_agg_mode`; "" when no single key is); the
    message names it and says what would fix it.
    """

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class StorageError(ConfigError):
    """A node of the cluster cannot see a path the run needs (the run folder, the model, a task set);
    the message names every such node and path (`arl_train.storage`)."""


class NodeLostError(RuntimeError):
    """A part of the run (a trainer rank, the rollout actor, a replica) was lost with its node or its
    process; the message names the part and the node (`arl_train.cluster.lost_actor`)."""


def invalid(key: str, value: object, rule: str) -> ConfigError:
    """The error for `key = value` breaking `rule` (the one message format of every config check)."""
    return ConfigError(f"invalid config: {key} = {_literal(value)}: {rule}", key)


def _literal(value: object) -> str:
    """`value` as it is written in TOML where that differs from Python (true/false)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def require(ok: bool, key: str, value: object, rule: str) -> None:
    """Raise `invalid(key, value, rule)` unless `ok`."""
    if not ok:
        raise invalid(key, value, rule)


def mentioned(names: list[str], message: str, prefer: Collection[str] = ()) -> str | None:
    """The field of `names` a check's message is about: of those it names, the first one in `prefer`
    (the keys the user set), else the first named."""
    found = sorted((m.start(), n) for n in names if (m := re.search(rf"\b{re.escape(n)}\b", message)))
    chosen = [n for _, n in found if n in prefer] or [n for _, n in found]
    return chosen[0] if chosen else None
