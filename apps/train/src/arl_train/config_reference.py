"""The generated config reference: every section and key of `AppConfig` with its type, default and doc.

`uv run python -m arl_train.config_reference` writes docs/reference/config.md; `--check` exits 1 when
the committed file is stale (apps/train's test_config_reference.py runs the same comparison). The docs
are the comments above each field in the struct that declares it: the package's struct for a field
a section takes from a package (`arl_train.borrow`; a docstring's "Fields:" list where the package
documents its fields there), the app's sections otherwise.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import re
import sys
import tokenize
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from arl_train.borrow import origin
from arl_train.legacy_keys import MOVED_KEYS
from arl_train.sections import AppConfig

REFERENCE = Path(__file__).resolve().parents[4] / "docs" / "reference" / "config.md"

_INTRO = """\
# Configuration reference (apps/train)

Generated from the config structs by `uv run python -m arl_train.config_reference`; do not edit by
hand (`apps/train/tests/test_config_reference.py` fails when this file is stale). How configs are
written and layered (TOML file, `--mode`, `section.key=value` overrides):
[guide/configuration.md](../guide/configuration.md).

Every key below is a TOML key of its section (`[actor]`, `[actor.algorithm]`, ...) and an override
`section.key=value` (the value is a TOML literal; a bare word is a string). A key whose description
names a package struct is that struct's own field (one declaration, in the package); *app default*
marks where the app starts from another default than the package, and why. Optional values (type
`... | None`) are unset by leaving the key out.
"""


def _struct(t: Any) -> type | None:
    return t if isinstance(t, type) and issubclass(t, msgspec.Struct) else None


_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def type_name(t: Any) -> str:
    """A TOML-minded spelling of a field's type."""
    if t is type(None):
        return "None"
    if _struct(t):
        return "table"
    origin_type, args = typing.get_origin(t), typing.get_args(t)
    if origin_type is typing.Annotated:  # a range msgspec checks at load: `int (>= 1)`
        bounds = [
            f"{op} {getattr(meta, name)}"
            for meta in t.__metadata__
            if isinstance(meta, msgspec.Meta)
            for name, op in _BOUNDS
            if getattr(meta, name) is not None
        ]
        return type_name(args[0]) + (f" ({', '.join(bounds)})" if bounds else "")
    if origin_type is typing.Literal:
        return " | ".join(_literal(a) for a in args)
    if origin_type in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin_type is dict:
        return "table (any keys)"
    if origin_type in (list, tuple):
        return f"array of {type_name(args[0])}" if args else "array"
    if t is Any:
        return "any"
    return getattr(t, "__name__", str(t))


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _default(f: msgspec.structs.FieldInfo) -> str:
    if f.default is not msgspec.NODEFAULT:
        value = f.default
    elif f.default_factory is not msgspec.NODEFAULT:
        value = f.default_factory()
    else:
        return "(required)"
    if value is None:
        return "unset"
    if isinstance(value, msgspec.Struct):
        return "(table below)"
    return f"`{_literal(value)}`"


@cache
def _declared_docs(cls: type) -> dict[str, str]:
    """The comment documenting each field declared in `cls`'s own body (a comment block above a field
    also covers the fields right below it that have none), else its docstring's "Fields:" entry."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    source = inspect.cleandoc("\n" + source) if source.startswith((" ", "\t")) else source
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, inline)
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), tok.start[0] in code_lines)
        elif tok.type not in (
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    body = ast_body(source)
    docs: dict[str, str] = {}
    previous_doc, previous_end = "", -10
    tables = {f.name for f in msgspec.structs.fields(cls) if _struct(f.type)}
    for name, start, end in body:
        is_table = name in tables  # documented by its own struct, never by a neighbour's comment
        above: list[str] = []
        line = start - 1
        while line >= 1 and line in comments and not comments[line][1]:
            above.insert(0, comments[line][0])
            line -= 1
        inline = [comments[n][0] for n in range(start, end + 1) if n in comments and comments[n][1]]
        doc = " ".join(above + inline).strip()
        if (
            not doc and not is_table and start == previous_end + 1 and previous_doc
        ):  # grouped under the comment above
            doc = previous_doc
        if doc:
            docs[name] = doc
        previous_doc, previous_end = doc, end
    return _docstring_fields(cls) | docs


def ast_body(source: str) -> list[tuple[str, int, int]]:
    """(field name, first line, last line) of each annotated assignment in the class body."""
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    return [
        (node.target.id, node.lineno, node.end_lineno or node.lineno)
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    ]


def _docstring_fields(cls: type) -> dict[str, str]:
    """A docstring's `Fields:` list (`name: text`, continued on deeper-indented lines)."""
    doc = inspect.getdoc(cls) or ""
    if "Fields:" not in doc:
        return {}
    found: dict[str, str] = {}
    current, indent = None, None
    for line in doc.split("Fields:", 1)[1].splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        m = re.match(r"\s*(\w+): (.*)", line)
        if m and (indent is None or depth <= indent):
            indent, current = depth, m[1]
            found[current] = m[2].strip()
        elif current is not None and indent is not None and depth > indent:
            found[current] += " " + line.strip()
        else:
            break
    return found


def field_doc(section: type, name: str) -> str:
    """The documentation of `section`'s field `name`, with its package origin and any app default."""
    found = origin(section, name)
    if found is not None:
        doc = _doc_in(found.source, found.name)
        source = (
            f"{found.source.__module__.split('.')[1] if found.source.__module__.startswith('arl.') else ''}"
        )
        parts = [doc, f"(`{found.source.__name__}.{found.name}`, arl-{source})"]
        if found.app_default is not msgspec.UNSET:
            package_default = next(f for f in msgspec.structs.fields(found.source) if f.name == found.name)
            parts.append(
                f"*App default* {_literal(found.app_default)} (the package's: "
                f"{_default(package_default).strip('`')}): {found.reason}."
            )
        if found.note:
            parts.append(found.note)
        return " ".join(p for p in parts if p)
    return _doc_in(section, name)


def _doc_in(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if klass is msgspec.Struct or not issubclass(klass, msgspec.Struct):
            continue
        found = origin(klass, name)
        if found is not None and klass is not cls:
            return field_doc(klass, name)
        docs = _declared_docs(klass)
        if name in docs:
            return docs[name]
    return ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(prefix: str, section: type, out: list[str], nested: list[tuple[str, type]]) -> None:
    out += ["| key | type | default | description |", "|---|---|---|---|"]
    for f in msgspec.structs.fields(section):
        sub = _struct(f.type)
        if sub is not None:
            nested.append((f"{prefix}.{f.name}" if prefix else f.name, sub))
        doc = field_doc(section, f.name)
        if sub is not None and _section_intro(sub) and not doc.startswith(_section_intro(sub)):
            doc = f"{_section_intro(sub)} {doc}".strip()
        out.append(f"| `{f.name}` | {_cell(type_name(f.type))} | {_cell(_default(f))} | {_cell(doc)} |")


def render() -> str:
    """The whole reference as Markdown."""
    out = [_INTRO]
    out += [
        "## Keys that moved",
        "",
        "The old key still works, with a warning naming the new one; setting both is an error.",
        "",
        "| old key | new key |",
        "|---|---|",
    ]
    out += [f"| `{old}` | `{new}` |" for old, new in MOVED_KEYS.items()]
    top = [f for f in msgspec.structs.fields(AppConfig) if _struct(f.type) is None]
    out += ["", "## Top level", "", "| key | type | default | description |", "|---|---|---|---|"]
    out += [
        f"| `{f.name}` | {_cell(type_name(f.type))} | {_cell(_default(f))} | "
        f"{_cell(field_doc(AppConfig, f.name))} |"
        for f in top
    ]
    queue: list[tuple[str, type]] = [
        (f.name, f.type) for f in msgspec.structs.fields(AppConfig) if _struct(f.type)
    ]
    while queue:
        prefix, section = queue.pop(0)
        out += ["", f"## [{prefix}]", ""]
        intro = _section_intro(section)
        if intro:
            out += [intro, ""]
        nested: list[tuple[str, type]] = []
        _table(prefix, section, out, nested)
        queue[0:0] = nested  # a table's sub-tables right after it
    return "\n".join(out) + "\n"


def _section_intro(section: type) -> str:
    doc = inspect.getdoc(section) if section.__doc__ else ""
    if not doc or doc.startswith(("A base class", "Struct(")):
        return ""
    return doc.split("Fields:", 1)[0].strip().split("\n\n", 1)[0].replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REFERENCE, help="where to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from the structs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.is_file() else ""
        if current != text:
            print(f"{args.out} is stale: run `uv run python -m arl_train.config_reference`", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
