"""Config sections made of the packages' own config fields, so that each field is declared once.

An app section that exposes fields of a package's config struct (arl-trainer's `TrainerConfig`,
the vLLM engine's `VllmEngineConfig`, arl-sync's `SyncConfig`) does not re-declare them: it derives
from `borrowed(...)`, a base class whose fields are the package's own (same type, same default, the
package's comment as their documentation), and adds only the app's fields. Where the app needs a
different default than a package user, `defaults` says so once, with the reason; the generated
config reference shows both. `pick(section, Struct)` gives a section's values of the fields `Struct`
has, to construct the package's config without copying fields by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec


@dataclass(frozen=True)
class Origin:
    """Where a section's field is declared: `source`'s field `name`; `app_default` (with `reason`)
    when the app's default differs from the package's; `note` when the app reads the value its own way."""

    source: type
    name: str
    app_default: Any = msgspec.UNSET
    reason: str = ""
    note: str = ""


_ORIGINS: dict[tuple[type, str], Origin] = {}


def take(source: type, *names: str) -> list[tuple[type, str]]:
    """Fields `names` of the package struct `source`, to pass to `borrowed`."""
    have = {f.name for f in msgspec.structs.fields(source)}
    missing = [n for n in names if n not in have]
    if missing:
        raise TypeError(f"{source.__qualname__} has no field(s) {missing}")
    return [(source, n) for n in names]


def borrowed(
    name: str,
    base: type,
    *groups: list[tuple[type, str]],
    defaults: dict[str, tuple[Any, str]] | None = None,
    notes: dict[str, str] | None = None,
) -> type:
    """A subclass of `base` holding the fields of `groups` (each from `take`) as the packages declare
    them; `defaults` maps a field to (the app's default, why it differs); `notes` adds how the app reads
    a field."""
    defaults, notes = defaults or {}, notes or {}
    specs: list[tuple[str, Any, Any]] = []
    origins: dict[str, Origin] = {}
    for source, field_name in (pair for group in groups for pair in group):
        f = next(f for f in msgspec.structs.fields(source) if f.name == field_name)
        if field_name in defaults:
            value, reason = defaults[field_name]
            default: Any = value
            origins[field_name] = Origin(source, field_name, value, reason, notes.get(field_name, ""))
        else:
            default = (
                f.default
                if f.default is not msgspec.NODEFAULT
                else msgspec.field(default_factory=f.default_factory)
            )
            origins[field_name] = Origin(source, field_name, note=notes.get(field_name, ""))
        specs.append((field_name, f.type, default))
    unknown = (set(defaults) | set(notes)) - set(origins)
    if unknown:
        raise TypeError(f"defaults/notes for fields not borrowed: {sorted(unknown)}")
    cls = msgspec.defstruct(name, specs, bases=(base,), kw_only=True, module=base.__module__)
    for field_name, origin in origins.items():
        _ORIGINS[(cls, field_name)] = origin
    return cls


def origin(section: type, field_name: str) -> Origin | None:
    """The package declaration of `section`'s field; None when the app (or an ordinary base) declares it."""
    for klass in section.__mro__:
        found = _ORIGINS.get((klass, field_name))
        if found is not None:
            return found
    return None


def pick(section: msgspec.Struct, target: type) -> dict[str, Any]:
    """`section`'s values of the fields that `target` (a package config struct) also has, by name."""
    wanted = {f.name for f in msgspec.structs.fields(target)}
    return {f.name: getattr(section, f.name) for f in msgspec.structs.fields(section) if f.name in wanted}
