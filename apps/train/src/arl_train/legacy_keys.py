"""Config keys that moved: the old key keeps working, with a warning naming the new one.

A key moves when a section starts embedding a package's own config struct (e.g. the optimizer's
fields now live in `actor.optim`, arl-trainer's `OptimConfig`) or when it turns out to belong to
another section (the run-wide waits, once under `[harbor]`, are `[run]`'s). `move_legacy_keys`
rewrites a raw TOML tree; `modern_key` rewrites one override's key. Both warn (FutureWarning: shown to
users by default) with the old and the new key; setting both is an error naming both.
"""

from __future__ import annotations

import warnings
from typing import Any

from arl_train.errors import ConfigError

# old dotted key -> new dotted key
MOVED_KEYS: dict[str, str] = {
    "actor.lr": "actor.optim.lr",
    "actor.grad_clip": "actor.optim.grad_clip",
    "actor.fused_optimizer": "actor.optim.fused",
    # Run-wide settings that every run has, Harbor or not, moved out of [harbor] into [run].
    "harbor.step_timeout_s": "run.step_timeout_s",
    "harbor.drain_timeout_s": "run.drain_timeout_s",
    "harbor.agent_workers": "run.agent_workers",
}


def _warn(old: str, new: str, where: str) -> None:
    warnings.warn(
        f"config key {old!r} ({where}) is deprecated: it is now {new!r}; the old key still works for now",
        FutureWarning,
        stacklevel=4,
    )


def modern_key(key: str, where: str = "override") -> str:
    """The current name of dotted `key` (itself unless it moved, then with a warning)."""
    new = MOVED_KEYS.get(key)
    if new is None:
        return key
    _warn(key, new, where)
    return new


def move_legacy_keys(tree: dict[str, Any], where: str = "config file") -> None:
    """Move every old key present in the raw `tree` to its new place, in place."""
    for old, new in MOVED_KEYS.items():
        *old_path, old_leaf = old.split(".")
        parent = _node(tree, old_path)
        if parent is None or old_leaf not in parent:
            continue
        *new_path, new_leaf = new.split(".")
        target = _node(tree, new_path, create=True)
        if target is None:
            raise ConfigError(
                f"invalid config: {new} cannot be set: {'.'.join(new_path)} is not a table", new
            )
        if new_leaf in target:
            raise ConfigError(
                f"invalid config: both {old} (its old name) and {new} are set in the {where}; "
                f"keep only {new}",
                new,
            )
        _warn(old, new, where)
        target[new_leaf] = parent.pop(old_leaf)


def _node(tree: dict[str, Any], path: list[str], create: bool = False) -> dict[str, Any] | None:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict):
            return None
        if part not in node:
            if not create:
                return None
            node[part] = {}
        node = node[part]
    return node if isinstance(node, dict) else None
