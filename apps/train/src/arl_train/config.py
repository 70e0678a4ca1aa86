"""Loading the app's configuration: defaults, a TOML file, a mode preset, CLI overrides, one validation.

The schema is `arl_train.sections` (re-exported here); overrides are `section.key=value` (value
parsed as a TOML literal, else taken as a string; the bare word `null` unsets an optional key), e.g.
`async_training.staleness_threshold=0.5 rollout.n=8`. Unknown keys and wrong types are refused with a
`ConfigError` naming the dotted key; keys that moved keep working with a warning
(`arl_train.legacy_keys`); `arl_train.validation.validate` checks every value and resolves the layout
before anything starts. Names follow the reference design where it has one.
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

import msgspec

from arl_train.errors import ConfigError, invalid, mentioned
from arl_train.legacy_keys import modern_key, move_legacy_keys
from arl_train.sections import (
    ActorConfig,
    AppConfig,
    AsyncTrainingConfig,
    ClusterSection,
    DataConfig,
    HarborSection,
    ModelConfig,
    OutputConfig,
    RayConfig,
    ResourcesConfig,
    RolloutConfig,
    RunSection,
    StorageSection,
    SwePresetConfig,
    SyncSection,
    TrainerSection,
    WarmStartConfig,
)
from arl_train.validation import validate

__all__ = [
    "DEFAULT_CONFIG",
    "MODES",
    "ActorConfig",
    "AppConfig",
    "AsyncTrainingConfig",
    "ClusterSection",
    "ConfigError",
    "DataConfig",
    "HarborSection",
    "ModelConfig",
    "OutputConfig",
    "RayConfig",
    "ResourcesConfig",
    "RolloutConfig",
    "RunSection",
    "StorageSection",
    "SwePresetConfig",
    "SyncSection",
    "TrainerSection",
    "WarmStartConfig",
    "load_config",
]

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.toml"

MODES: dict[str, dict[str, Any]] = {
    "a": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.0, "partial_rollout": False},
    "b": {"trigger_parameter_sync_step": 2, "staleness_threshold": 0.0, "partial_rollout": False},
    "c": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": False},
    "d": {"trigger_parameter_sync_step": 1, "staleness_threshold": 0.5, "partial_rollout": True},
}


class _Null(str):
    """The bare word `null` of an override: None for an optional field (TOML has no null), the string
    "null" for any other."""


def _parse_value(text: str) -> Any:
    if text == "null":
        return _Null(text)
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _admits_none(field_type: Any) -> bool:
    return type(None) in typing.get_args(field_type)


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` in the raw tree, checking every part names a real field."""
    parts = dotted.split(".")
    struct_type: Any = AppConfig
    node = tree
    for depth, part in enumerate(parts):
        fields = {f.name: f for f in msgspec.structs.fields(struct_type)}
        if part not in fields:
            where = ".".join(parts[:depth]) or "top level"
            raise ConfigError(
                f"unknown config key {dotted!r}: {part!r} is not a field of {where} "
                f"(fields: {sorted(fields)})",
                dotted,
            )
        if depth == len(parts) - 1:
            if isinstance(value, _Null):
                value = None if _admits_none(fields[part].type) else str(value)
            node[part] = value
            return
        struct_type = fields[part].type
        if getattr(struct_type, "__origin__", None) is dict:  # a free-form table: any key below it
            table = node.setdefault(part, {})
            for sub in parts[depth + 1 : -1]:
                table = table.setdefault(sub, {})
            table[parts[-1]] = str(value) if isinstance(value, _Null) else value
            return
        if not (isinstance(struct_type, type) and issubclass(struct_type, msgspec.Struct)):
            raise ConfigError(
                f"unknown config key {dotted!r}: {'.'.join(parts[: depth + 1])} is not a section", dotted
            )
        node = node.setdefault(part, {})


def load_config(path: Path | None = None, overrides: list[str] = (), mode: str | None = None) -> AppConfig:
    """Defaults ← TOML file ← mode preset (a–d) ← `section.key=value` overrides."""
    path = path or DEFAULT_CONFIG
    try:
        tree = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    move_legacy_keys(tree, f"config file {path}")
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; choose one of {sorted(MODES)}")
        for key, value in MODES[mode].items():
            _set(tree, f"async_training.{key}", value)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        _set(tree, modern_key(key.strip()), _parse_value(value.strip()))
    return validate(convert(tree))


def convert(tree: dict[str, Any]) -> AppConfig:
    """The raw tree as an `AppConfig`; a wrong type, an unknown key or a package struct's own check
    (e.g. `AlgorithmConfig`'s ranges) becomes a `ConfigError` naming the dotted key."""
    try:
        return msgspec.convert(tree, AppConfig)
    except msgspec.ValidationError as exc:
        raise _named(str(exc), tree) from None


_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def _named(message: str, tree: dict[str, Any]) -> ConfigError:
    """msgspec's 'what - at `$.a.b`' as 'invalid config: a.b: what' (the key at fault first)."""
    m = _AT.match(message)
    what, path = m["what"], (m["path"] or "").lstrip(".")
    key = re.sub(r"\[\d+\]", "", path)
    unknown = _UNKNOWN.search(what)
    if unknown:
        key = f"{key}.{unknown['field']}" if key else unknown["field"]
        return ConfigError(f"invalid config: unknown config key {key!r}", key)
    section = _struct_at(key)
    if section is not None:  # a struct's own check (__post_init__): name the field its message names
        given = _raw(tree, key)
        named = mentioned([f.name for f in msgspec.structs.fields(section)], what, prefer=given)
        if named:
            key = f"{key}.{named}" if key else named
            if named in given:
                return invalid(key, given[named], what)
    return ConfigError(f"invalid config: {key or 'top level'}: {what}", key)


def _raw(tree: dict[str, Any], key: str) -> dict[str, Any]:
    node: Any = tree
    for part in key.split(".") if key else []:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def _struct_at(key: str) -> type | None:
    struct: Any = AppConfig
    for part in key.split(".") if key else []:
        fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
        struct = fields.get(part)
        if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
            return None
    return struct
