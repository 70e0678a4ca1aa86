"""Packed per-token arrays: the in-memory and on-the-wire form of token ids, log probs, masks and versions.

A 32k-token sample carries ~131k per-token values. As msgpack lists of Python ints and floats every one
of them is parsed and boxed on each decode (milliseconds per sample); as packed little-endian arrays a
decode is a memory copy, and the trainer can view them without copying (`torch.frombuffer(a,
dtype=torch.int32)`, `numpy.frombuffer`). The three types here are `array.array`s of a fixed item type
that still read like the lists they replace: `len`, indexing, slicing, iteration, `==` against lists,
`+` with lists, pickling. On the wire (see `codec`) each is one msgpack `bin`.

| type           | holds                       | item          |
|----------------|-----------------------------|---------------|
| `Int32Array`   | token ids, weight versions  | int32         |
| `Float32Array` | log probs                   | float32       |
| `UInt8Array`   | masks (0/1)                 | uint8         |

Log probs are float32 (as engines compute them); a list of Python floats is rounded on construction,
and `==` against a list compares after the same rounding.

Needs only the standard library (`array`), so arl-queue stays light.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Any, ClassVar, Self

from arl.queue.errors import PackedArrayError

_LITTLE = sys.byteorder == "little"


class _Packed(array):
    """An `array.array` of one fixed item type that behaves like a list where callers rely on it."""

    TYPECODE: ClassVar[str]
    DTYPE: ClassVar[str]
    ITEMSIZE: ClassVar[int]

    def __new__(cls, values: Iterable[Any] = ()) -> Self:
        return super().__new__(cls, cls.TYPECODE, values)

    @classmethod
    def from_wire(cls, data: bytes | bytearray | memoryview, field: str = "") -> Self:
        """The array held in little-endian `data` (one copy); `PackedArrayError` (naming `field`, if
        given) when `data` is not a whole number of items."""
        if len(data) % cls.ITEMSIZE:
            prefix = f"{field}: " if field else ""
            raise PackedArrayError(
                f"{prefix}{len(data)} bytes are not a whole number of {cls.DTYPE} "
                f"({cls.ITEMSIZE}-byte) items (truncated or corrupt)"
            )
        out = cls()
        out.frombytes(data)
        if not _LITTLE:
            out.byteswap()
        return out

    def wire(self) -> memoryview | bytes:
        """The little-endian bytes of the array (a view on little-endian hosts)."""
        if _LITTLE:
            return memoryview(self).cast("B")
        swapped = array(self.typecode, self)
        swapped.byteswap()
        return swapped.tobytes()

    # ----- list-like behaviour (array's own returns a plain array, which never equals a list) -----

    def __eq__(self, other: object) -> bool:
        if isinstance(other, array):
            return array.__eq__(self, other)
        if isinstance(other, (list, tuple)):
            try:
                return array.__eq__(self, type(self)(other))
            except (TypeError, ValueError, OverflowError):
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    def __getitem__(self, index: Any) -> Any:
        item = array.__getitem__(self, index)
        return type(self)(item) if isinstance(index, slice) else item

    def __add__(self, other: Any) -> Self:
        out = type(self)(self)
        out.extend(
            other if isinstance(other, array) and other.typecode == self.typecode else type(self)(other)
        )
        return out

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, list):
            return other + self.tolist()
        return NotImplemented

    def __mul__(self, n: Any) -> Self:
        return type(self)(array.__mul__(self, n))

    __rmul__ = __mul__

    def __copy__(self) -> Self:
        return type(self)(self)

    def __deepcopy__(self, memo: Any) -> Self:
        return type(self)(self)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (type(self).from_wire, (bytes(self.wire()),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.tolist()!r})"


class Int32Array(_Packed):
    """Token ids or weight versions: int32."""

    TYPECODE = "i"
    DTYPE = "int32"
    ITEMSIZE = 4


class Float32Array(_Packed):
    """Log probs: float32."""

    TYPECODE = "f"
    DTYPE = "float32"
    ITEMSIZE = 4


class UInt8Array(_Packed):
    """Masks: uint8 (0 or 1)."""

    TYPECODE = "B"
    DTYPE = "uint8"
    ITEMSIZE = 1

    def count_nonzero(self) -> int:
        """Items that are not 0 (the trained tokens of a mask), without boxing each one."""
        return len(self) - self.tobytes().count(0)

    def only_zero_one(self) -> bool:
        """True when every item is 0 or 1."""
        return not self.tobytes().translate(None, b"\x00\x01")


PACKED_TYPES: tuple[type[_Packed], ...] = (Int32Array, Float32Array, UInt8Array)

for _cls in PACKED_TYPES:  # the wire format assumes these item sizes
    if array(_cls.TYPECODE).itemsize != _cls.ITEMSIZE:  # pragma: no cover - exotic platforms
        raise ImportError(f"array typecode {_cls.TYPECODE!r} is not {_cls.ITEMSIZE} bytes on this platform")


def coerce(value: Any, cls: type[_Packed], field: str) -> Any:
    """`value` as a `cls` (None and `cls` instances pass through); `PackedArrayError` naming `field` when
    an item does not fit the type (a token id beyond int32, a mask of -1, a string)."""
    if value is None or type(value) is cls:
        return value
    try:
        if isinstance(value, (bytes, bytearray, memoryview)):  # raw wire bytes
            return cls.from_wire(value, field)
        return cls(value)
    except PackedArrayError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        prefix = f"{field}: " if field else ""
        raise PackedArrayError(f"{prefix}cannot be stored as {cls.DTYPE}: {exc}") from exc


def enc_hook(obj: Any) -> Any:
    """msgspec encoder hook: a packed array travels as one msgpack `bin` of its little-endian items."""
    if isinstance(obj, _Packed):
        return obj.wire()
    raise NotImplementedError(f"cannot encode objects of type {type(obj).__name__}")


def dec_hook(kind: type, obj: Any) -> Any:
    """msgspec decoder hook: `bin` back to a packed array (a copy). A list (schema ≤ 4, or a field that
    was assigned a list after construction) is packed item by item."""
    if isinstance(kind, type) and issubclass(kind, _Packed):
        if isinstance(obj, (bytes, bytearray, memoryview, list)):
            return coerce(obj, kind, "")
        raise PackedArrayError(f"expected {kind.DTYPE} bytes, got {type(obj).__name__}")
    raise NotImplementedError(f"cannot decode type {kind!r}")


def builtins_hook(obj: Any) -> Any:
    """`msgspec.to_builtins` hook: packed arrays as plain lists (for JSON, or the reference's codec)."""
    if isinstance(obj, _Packed):
        return obj.tolist()
    raise NotImplementedError(f"cannot convert objects of type {type(obj).__name__}")
