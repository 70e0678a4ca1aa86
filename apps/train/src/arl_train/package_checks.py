"""The packages' own checks of a config, each error named by the app's dotted key.

A package validates its config fields itself (its struct's `__post_init__` raises a `ValueError`
whose message names the field), so a package used alone refuses the same values the app does; the
app only maps the error to the key it was set under. Two passes, both run by `validation.validate`:

* `check_borrowed` (first, before the app's own rules, which read these values): every package
  struct a section borrows fields from (`arl_train.borrow`) is built from that section's values of
  them, the package's defaults for the rest, so `actor.ppo_mini_batch_size = 0` is refused by
  arl-trainer's `TrainerConfig` as `actor.ppo_mini_batch_size`. Nested package structs
  (`actor.optim`, `actor.algorithm`, `[harbor]`) check themselves at conversion (`config.convert`).
* `check_packages` (last, on the resolved config): the packages' configs as the run builds them
  (`arl_train.package_configs`), with the values the app derives across sections.
"""

from __future__ import annotations

from typing import Any

import msgspec

from arl_train.borrow import origin
from arl_train.errors import ConfigError, invalid, mentioned
from arl_train.package_configs import engine_config, package_value, sync_config, trainer_config
from arl_train.sections import AppConfig

# Values for a package struct's required fields that no section holds (the run supplies them later).
_STAND_INS: dict[str, Any] = {"model_path": ""}


def check_borrowed(config: AppConfig) -> None:
    """Build each package struct from the fields a section borrows from it; a package's refusal
    becomes a `ConfigError` naming `section.field`."""
    for section, section_type in _sections():
        values = getattr(config, section)
        by_source: dict[type, dict[str, Any]] = {}
        for f in msgspec.structs.fields(section_type):
            found = origin(section_type, f.name)
            if found is not None:
                value = package_value(f"{section}.{f.name}", getattr(values, f.name))
                by_source.setdefault(found.source, {})[found.name] = value
        for source, fields in by_source.items():
            required = {f.name for f in msgspec.structs.fields(source) if f.required} - set(fields)
            try:
                source(**{name: _STAND_INS[name] for name in required} | fields)
            except ValueError as exc:
                name = mentioned(list(fields), str(exc), prefer=_changed(section_type, values, fields))
                if name is None:
                    raise ConfigError(f"invalid config: {section}: {exc}", section) from None
                raise invalid(f"{section}.{name}", getattr(values, name), str(exc)) from None


def check_packages(config: AppConfig) -> None:
    """The packages' configs as the run builds them, each error named by the app's key."""
    for section, build in (
        ("actor", lambda: trainer_config(config)),
        ("rollout", lambda: engine_config(config, "", 0, 0)),
        ("sync", lambda: sync_config(config)),
    ):
        try:
            build()
        except ValueError as exc:
            key = _key_in_message(config, str(exc)) or section
            raise ConfigError(f"invalid config: {key}: {exc}", key) from None


def _sections() -> list[tuple[str, type]]:
    return [
        (f.name, f.type)
        for f in msgspec.structs.fields(AppConfig)
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)
    ]


def _changed(section_type: type, values: Any, names: Any) -> set[str]:
    """Of `names`, the fields whose value is not the section's default (the ones the user set)."""
    defaults = {f.name: f.default for f in msgspec.structs.fields(section_type)}
    return {
        n
        for n in names
        if defaults.get(n, msgspec.NODEFAULT) is not msgspec.NODEFAULT and getattr(values, n) != defaults[n]
    }


def _key_in_message(config: AppConfig, message: str) -> str | None:
    """The dotted key of the borrowed field a package's error message names (of several, the first
    one whose value is not the default: the one the user set)."""
    keys: dict[str, str] = {}
    changed: set[str] = set()
    for section, section_type in _sections():
        values = getattr(config, section)
        for f in msgspec.structs.fields(section_type):
            found = origin(section_type, f.name)
            if found is not None:
                keys.setdefault(found.name, f"{section}.{f.name}")
                if f.name in _changed(section_type, values, [f.name]):
                    changed.add(found.name)
    name = mentioned(list(keys), message, prefer=changed)
    return keys[name] if name else None
