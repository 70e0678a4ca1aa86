"""Packing MoE routing (expert ids per token, layer and top-k slot) into `RoutedExperts` and back.

An engine reports, for every sampled token, the experts each MoE layer chose in the forward step that
sampled it: `layers x top_k` small integers. Kept as nested Python lists that is ~30 bytes of objects
per id; on the wire it is one C-order byte string of uint8 ids (uint16 for models with more than 255
experts), i.e. `layers * top_k` (or twice that) bytes per token: 384 B for Qwen3-30B-A3B (48 layers,
top-8, 128 experts). Tokens the engine did not route (prompt, tool output, template text) carry the
dtype's maximum value (255 / 65535) in every slot: the trainer routes those itself.

Needs only the standard library (`array`), so arl-queue stays light.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

from arl.queue.errors import RoutedExpertsError
from arl.queue.types import RoutedExperts

_TYPECODE = {"uint8": "B", "uint16": "H"}
SENTINEL = {"uint8": 0xFF, "uint16": 0xFFFF}


def bytes_per_token(num_layers: int, top_k: int, num_experts: int) -> int:
    """Wire size of one token's routing for a model of this shape."""
    return num_layers * top_k * (1 if num_experts < SENTINEL["uint8"] else 2)


def _dtype_for(max_id: int) -> str:
    if max_id < SENTINEL["uint8"]:
        return "uint8"
    if max_id < SENTINEL["uint16"]:
        return "uint16"
    raise RoutedExpertsError(f"expert id {max_id} does not fit in uint16 (max {SENTINEL['uint16'] - 1})")


def pack_routes(rows: Sequence[Any], *, num_experts: int | None = None) -> RoutedExperts | None:
    """Pack per-token routing rows into `RoutedExperts`.

    `rows[i]` is token i's routing as `layers x top_k` ints, or empty / None when the engine did not
    route that token (it is then marked for the trainer). Returns None when no row has routing. The
    dtype is uint8 unless `num_experts` (or the largest id seen) needs uint16.
    """
    shape: tuple[int, int] | None = None
    for row in rows:
        if row is not None and len(row):
            shape = (len(row), len(row[0]))
            break
    if shape is None:
        return None
    layers, top_k = shape
    flat: list[int] = []
    for i, row in enumerate(rows):
        if row is None or not len(row):
            flat.extend([-1] * (layers * top_k))
            continue
        if len(row) != layers or any(len(r) != top_k for r in row):
            raise RoutedExpertsError(
                f"routing row {i} is not {layers} layers x {top_k} experts like row 0 (ragged routing)"
            )
        for r in row:
            flat.extend(int(e) for e in r)
    lo = min(flat)
    if lo < -1:  # -1 inside a row (a dense layer, an unreported layer) is kept as the marker too
        raise RoutedExpertsError(f"negative expert id {lo} in routing rows")
    hi = max(flat)
    dtype = _dtype_for(max(hi, (num_experts or 1) - 1))
    sentinel = SENTINEL[dtype]
    if any(e == sentinel for e in flat):
        raise RoutedExpertsError(f"expert id {sentinel} is reserved as the 'trainer routes' marker")
    packed = array(_TYPECODE[dtype], (sentinel if e < 0 else e for e in flat))
    if sys.byteorder != "little":
        packed.byteswap()
    return RoutedExperts(data=packed.tobytes(), shape=(len(rows), layers, top_k), dtype=dtype)  # type: ignore[arg-type]


def route_ids(routes: RoutedExperts) -> array:
    """The flat ids (C-order over (tokens, layers, top_k)), sentinel where the trainer routes; checked."""
    typecode = _TYPECODE.get(routes.dtype)
    if typecode is None:
        raise RoutedExpertsError(f"unknown routed-experts dtype {routes.dtype!r}")
    ids = array(typecode)
    if len(routes.data) % ids.itemsize:
        raise RoutedExpertsError(f"{len(routes.data)} bytes are not a whole number of {routes.dtype} ids")
    ids.frombytes(routes.data)
    if sys.byteorder != "little":
        ids.byteswap()
    tokens, layers, top_k = routes.shape
    if min(routes.shape) < 0 or len(ids) != tokens * layers * top_k:
        raise RoutedExpertsError(
            f"routed experts hold {len(ids)} ids, shape {routes.shape} needs {tokens * layers * top_k}"
        )
    return ids


def unpack_routes(routes: RoutedExperts) -> list[list[list[int]]]:
    """Inverse of `pack_routes`: per token `layers x top_k` ids, `[]` for tokens the trainer routes."""
    ids = route_ids(routes)
    tokens, layers, top_k = routes.shape
    sentinel = SENTINEL[routes.dtype]
    per_token = layers * top_k
    out: list[list[list[int]]] = []
    for t in range(tokens):
        chunk = ids[t * per_token : (t + 1) * per_token]
        if all(e == sentinel for e in chunk):
            out.append([])
        else:
            out.append([list(chunk[layer * top_k : (layer + 1) * top_k]) for layer in range(layers)])
    return out
