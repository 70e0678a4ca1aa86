"""Config sections holding the packages' own config fields, declared in the section and checked against
the package, so that each field has one definition.

An app section that exposes fields of a package's config struct (arl-trainer's `TrainerConfig`, the
vLLM engine's `VllmEngineConfig`, arl-sync's `SyncConfig`) declares them as ordinary typed fields, so
editors and type checkers see them, and says where they come from with the `borrows(Struct, ...)` class
decorator: at import it checks that every field of the class is the package's own, with the package's
type and default, and records the package's comment as its documentation. Where the app needs a
different default than a package user, `defaults` says why, once (the decorator refuses a default that
differs without a reason, or a reason for a default that does not differ); the generated config
reference shows both. `pick(section, Struct)` gives a section's values of the fields `Struct` has, to
construct the package's config without copying fields by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

T = TypeVar("T", bound=type)


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


def _default(f: msgspec.structs.FieldInfo) -> Any:
    if f.default is not msgspec.NODEFAULT:
        return f.default
    return f.default_factory() if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT


def borrows(
    source: type, *, defaults: dict[str, str] | None = None, notes: dict[str, str] | None = None
) -> Callable[[T], T]:
    """Class decorator: every field the decorated section declares itself is `source`'s field of that
    name, with its type and default; `defaults` maps a field whose default the app changes to why;
    `notes` adds how the app reads a field. Raises `TypeError` at import on any mismatch."""
    defaults, notes = defaults or {}, notes or {}

    def record(section: T) -> T:
        theirs = {f.name: f for f in msgspec.structs.fields(source)}
        inherited = {
            f.name
            for base in section.__bases__
            if issubclass(base, msgspec.Struct)
            for f in msgspec.structs.fields(base)
        }
        own = [f for f in msgspec.structs.fields(section) if f.name not in inherited]
        problems = []
        for f in own:
            package = theirs.get(f.name)
            if package is None:
                problems.append(f"{f.name}: {source.__qualname__} has no such field")
                continue
            if f.type != package.type:
                problems.append(f"{f.name}: type {f.type!r}, the package's is {package.type!r}")
            mine, its = _default(f), _default(package)
            if f.name in defaults:
                if mine == its:
                    problems.append(f"{f.name}: a reason for an app default that is the package's ({its!r})")
                _ORIGINS[(section, f.name)] = Origin(
                    source, f.name, mine, defaults[f.name], notes.get(f.name, "")
                )
            else:
                if mine != its:
                    problems.append(
                        f"{f.name}: default {mine!r}, the package's is {its!r} (say why in defaults)"
                    )
                _ORIGINS[(section, f.name)] = Origin(source, f.name, note=notes.get(f.name, ""))
        unknown = (set(defaults) | set(notes)) - {f.name for f in own}
        if unknown:
            problems.append(f"defaults/notes for fields the section does not declare: {sorted(unknown)}")
        if problems:
            raise TypeError(
                f"{section.__qualname__} borrows from {source.__qualname__}: " + "; ".join(problems)
            )
        return section

    return record


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
