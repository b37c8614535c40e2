"""Prefix identity of requests: the trace column of chained block hashes (docs/traces.md
"Prefix hashes") and how it maps to the simulator's KV block size.

A trace may carry ``prefix_hashes`` (list<int64>, one non-negative hash per block of the prompt at
the trace's *native* block size, metadata ``prefix_block_size``). Hash ``i`` names the prompt's
first ``(i + 1) x native`` tokens (a chain: each hash covers its parent's), so two requests share a
block exactly when their hashes at that position are equal. The last hash may name a partial block
(Mooncake's ``hash_ids`` cover ``ceil(prompt / 512)`` blocks); at most ``ceil(prompt / native)``.

At ``--block-size B`` (:func:`block_keys`): a native block of ``native = r x B`` tokens names its
``r`` sub-blocks ``mix(hash, j)``, j = 0..r-1; with ``B = r x native`` a block is named by the hash of
the last native block inside it. Only the prompt's full B-blocks are named (``prompt // B`` at most);
any other block size is refused. Every block a request has beyond them (the rest of its prompt, its
generated tokens) is named uniquely for the request (:func:`own_keys`), so no other request shares it,
and a request without prefix identity shares nothing but its own blocks (after a preemption).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa

from core.contract import TraceError

COLUMN = "prefix_hashes"
#: optional, beside it: the hashes of the request's full blocks past its prompt's, over prompt + generated
#: tokens (a live run with vLLM's prefix caching records them: vLLM names a block by its tokens, and a
#: generated block can equal another prompt's block)
OUTPUT_COLUMN = "output_hashes"
META_KEY = "prefix_block_size"
MOONCAKE_BLOCK = 512   # tokens per block of Mooncake's hash_ids
MASK = np.uint64((1 << 63) - 1)
_U64 = (1 << 64) - 1
_OWN_SALT = np.uint64(0x5DEECE66D2B7E151)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def chain(parent: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The hash of a block whose parent hashes to ``parent`` (0 for the first block) and whose own
    content is ``value``: non-negative int64."""
    return (mix(np.asarray(parent, dtype=np.uint64) ^ mix(value)) & MASK).astype(np.int64)


def _mix_int(x: int) -> int:
    """:func:`mix` of one value in Python integers (the same bits)."""
    z = (x + 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


def chain_ids(ids: list[int]) -> list[int]:
    """:func:`chain` along one request's block ids (Mooncake's ``hash_ids``): hash i from hash i-1."""
    out: list[int] = []
    parent = 0
    for value in ids:
        parent = _mix_int(parent ^ _mix_int(value & _U64)) & int(MASK)
        out.append(parent)
    return out


def read_hash_ids(path, prompt: np.ndarray) -> list[list[int]] | None:
    """Mooncake's ``hash_ids`` of a JSON-lines file, each row's chained (:func:`chain_ids`), or None
    when its first record has none. Refused, naming the file and row: not a list of non-negative
    integers, empty where the prompt is not, more than ``ceil(prompt / 512)`` blocks."""
    import json

    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    out: list[list[int]] = []
    for row, line in enumerate(lines):
        ids = json.loads(line).get("hash_ids")
        if row == 0 and ids is None:
            return None
        if not isinstance(ids, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ids):
            raise TraceError(f"trace {path}: field hash_ids: row {row}: expected a list of non-negative integers, "
                             f"found {str(ids)[:60]}")
        if not ids and prompt[row] > 0:
            raise TraceError(f"trace {path}: field hash_ids: row {row}: empty, but the prompt has {prompt[row]} tokens")
        if len(ids) > -(-int(prompt[row]) // MOONCAKE_BLOCK):
            raise TraceError(f"trace {path}: field hash_ids: row {row}: {len(ids)} blocks of {MOONCAKE_BLOCK} tokens, "
                             f"more than its {prompt[row]} prompt tokens allow")
        out.append(chain_ids(ids))
    return out


def token_block_hashes(token_ids, native: int) -> list[int]:
    """Chained hashes of a prompt's full ``native``-token blocks from its token ids (capture)."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    ids = [int.from_bytes(hashlib.blake2b(tokens[i * native:(i + 1) * native].tobytes(), digest_size=8).digest(),
                          "little") for i in range(len(tokens) // native)]
    return chain_ids(ids)


def check_column(table: pa.Table, meta: dict, where: str) -> None:
    """The column's contract: list<int64> of non-negative hashes, at most ceil(prompt / native) per
    row, with ``prefix_block_size`` in the metadata. Raises :class:`TraceError` naming the row."""
    if COLUMN not in table.column_names:
        if OUTPUT_COLUMN in table.column_names:
            raise TraceError(f"{where}: column {OUTPUT_COLUMN} continues {COLUMN}, which the trace does not have")
        return
    native = meta.get(META_KEY)
    if isinstance(native, bool) or not isinstance(native, int) or native < 1:
        raise TraceError(f"{where}: column {COLUMN} needs metadata {META_KEY} (a positive integer), found {native!r}")
    offsets = _hash_lists(table, COLUMN, where)
    _check_outputs(table, where)
    prompt = table.column("prompt_tokens").to_numpy().astype(np.int64)
    over = np.diff(offsets) > -(-prompt // native)
    if over.any():
        row = int(np.flatnonzero(over)[0])
        raise TraceError(f"{where}: column {COLUMN}: row {row}: {int(np.diff(offsets)[row])} blocks of {native} "
                         f"tokens, more than its {int(prompt[row])} prompt tokens allow")


def native_chains(trace) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(offsets, hashes, native block size) of a trace's column in its row order, or None."""
    if COLUMN not in trace.table.column_names:
        return None
    col = trace.table.column(COLUMN).combine_chunks()
    return (col.offsets.to_numpy().astype(np.int64) - int(col.offsets[0].as_py()),
            col.flatten().to_numpy().astype(np.int64), int(trace.metadata[META_KEY]))


def output_chains(trace) -> tuple[np.ndarray, np.ndarray] | None:
    """(offsets, hashes) of a trace's ``output_hashes`` column in its row order, or None."""
    if OUTPUT_COLUMN not in trace.table.column_names:
        return None
    col = trace.table.column(OUTPUT_COLUMN).combine_chunks()
    return (col.offsets.to_numpy().astype(np.int64) - int(col.offsets[0].as_py()),
            col.flatten().to_numpy().astype(np.int64))


def output_keys(hashes: np.ndarray, native: int) -> np.ndarray:
    """The keys of the blocks ``output_hashes`` name, at their own block size (as :func:`block_keys`
    names a prompt's blocks at ``--block-size`` = native, so that equal tokens give equal keys)."""
    return block_keys(hashes, native, native, len(hashes) * native)


def check_block_size(native: int, size: int, what: str) -> None:
    """``--block-size`` must divide the native block size or be a multiple of it."""
    if native % size and size % native:
        raise TraceError(f"--block-size {size}: {what} names prefix blocks of {native} tokens; one of the two "
                         "must divide the other")


def block_keys(hashes: np.ndarray, native: int, size: int, prompt: int) -> np.ndarray:
    """The keys of a prompt's first full ``size``-token blocks named by its native ``hashes``."""
    full = prompt // size
    if native >= size:
        r = native // size
        sub = np.arange(r, dtype=np.uint64)
        keys = chain(np.repeat(hashes.astype(np.uint64), r), np.tile(sub, len(hashes)))
    else:
        r = size // native
        keys = hashes[r - 1::r]
    return keys[:full].astype(np.int64)


def own_keys(row: int, start: int, stop: int) -> np.ndarray:
    """Keys of blocks ``start..stop-1`` that only request ``row`` has."""
    seed = mix(np.asarray([row], dtype=np.uint64) ^ _OWN_SALT)
    return chain(np.repeat(seed, max(stop - start, 0)), np.arange(start, max(stop, start), dtype=np.uint64))


def _check_outputs(table: pa.Table, where: str) -> None:
    """``output_hashes`` (beside ``prefix_hashes``): list<int64> of non-negative hashes, no nulls."""
    if OUTPUT_COLUMN in table.column_names:
        _hash_lists(table, OUTPUT_COLUMN, where)


def _hash_lists(table: pa.Table, column: str, where: str) -> np.ndarray:
    """Check that ``column`` is list<int> of non-negative hashes without nulls; its list offsets."""
    dtype = table.schema.field(column).type
    if not (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) or not pa.types.is_integer(dtype.value_type):
        raise TraceError(f"{where}: column {column}: expected list<int64>, found {dtype}")
    col = table.column(column).combine_chunks()
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise TraceError(f"{where}: column {column}: row {row}: null (an empty list names no blocks)")
    offsets, values = col.offsets.to_numpy().astype(np.int64), col.flatten().to_numpy().astype(np.int64)
    if (values < 0).any():
        row = int(np.searchsorted(offsets, int(np.flatnonzero(values < 0)[0]), side="right") - 1)
        raise TraceError(f"{where}: column {column}: row {row}: a negative hash")
    return offsets
