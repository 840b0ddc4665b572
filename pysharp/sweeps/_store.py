"""The resumable Zarr store of a sweep: an xarray store with completion markers.

Layout of ``path.zarr`` (Zarr format 3): one array per output on the grid's
named axes (``dimension_names`` = lr, wd, seed, init_norm, or lr, batch, wd,
seed, init_norm for SGD, and, for recorded metrics, ``step`` or
``sharpness_step``), one array per coordinate, the Dataset's attributes as
the group's attributes. ``xarray.open_zarr(path)`` therefore returns the
Dataset ``pysharp.sweep`` returned.

A sweep chunk is one block of the grid (see :func:`block_shape`) and exactly
one Zarr chunk of each array, so no two sweep chunks ever share bytes. A chunk
counts as finished only once ``_pysharp_done/<k>.json`` exists (in an empty
Zarr group, which xarray ignores): it is written
after the data, atomically (write to a temporary file, then rename), and holds
the SHA-256 of every array's bytes for the chunk, which are checked when the
chunk is read back (:meth:`SweepStore.read`), so a truncated or altered chunk
is recomputed, never silently used. ``xarray.open_zarr`` does not look at the
markers: :func:`pysharp.open_sweep` is the reader that verifies them.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

#: Stored in the group's (and the Dataset's) ``pysharp_format`` attribute.
FORMAT = "pysharp-sweep/2"
_DONE = "_pysharp_done"


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def block_shape(shape: tuple[int, ...], chunk_size: int) -> tuple[int, ...]:
    """The grid block of one chunk: whole rows of the trailing axes, at most ``chunk_size`` points.

    Parameters
    ----------
    shape : tuple of int
        The grid's shape (one entry per grid axis, C order).
    chunk_size : int
        Upper bound on the points of a block (>= 1).

    Returns
    -------
    tuple of int, same length as ``shape``
        ``(1, ..., 1, c, n_{j+1}, ..., n_last)`` for the first axis j whose trailing
        axes hold at most ``chunk_size`` points, with ``c`` as large as allowed. Such a
        block is a contiguous range of the flat (C order) grid, so each chunk is one
        engine call over consecutive trajectories and one rectangular Zarr chunk.
    """
    for j in range(len(shape)):
        tail = math.prod(shape[j + 1:])
        if tail <= chunk_size:
            return (1,) * j + (min(shape[j], chunk_size // tail),) + tuple(shape[j + 1:])
    return tuple(shape)  # no axes


class ChunkBounds(Sequence):
    """[start, stop) in the flat grid of every chunk, in C order over the blocks.

    The blocks of :func:`block_shape` tile the grid; the last block along the cut
    axis may be short. A sequence computed on demand: chunk k's bounds are a few
    integer operations, so a sweep of 1e7 chunks holds no list of them (as tuples
    of Python ints that list alone would take 1.85 GB).
    """

    def __init__(self, shape: tuple[int, ...], chunk_size: int) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.block = block_shape(self.shape, chunk_size)
        self.counts = tuple(-(-n // b) for n, b in zip(self.shape, self.block))
        self._n = math.prod(self.counts)

    def __len__(self) -> int:
        return self._n

    def region(self, k: int) -> tuple[slice, ...]:
        """Chunk k's block of the grid, as slices of the grid axes."""
        if not 0 <= k < self._n:
            raise IndexError(f"chunk {k} of {self._n}")
        corner = []
        for count in reversed(self.counts):
            k, i = divmod(k, count)
            corner.append(i)
        return tuple(slice(i * b, min((i + 1) * b, n))
                     for i, b, n in zip(reversed(corner), self.block, self.shape))

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        k = operator.index(k)
        region = self.region(k + self._n if k < 0 else k)
        start = 0
        for s, n in zip(region, self.shape):  # C order: the flat index of the corner
            start = start * n + s.start
        return start, start + math.prod(s.stop - s.start for s in region)

    def trajectories(self, ks) -> int:
        """The trajectories of the chunks ``ks`` (1-D integer array), together."""
        total = 0
        block, shape = np.array(self.block), np.array(self.shape)
        for part in np.array_split(np.asarray(ks, dtype=np.int64), 1 + len(ks) // 2**20):
            if part.size:
                corner = np.stack(np.unravel_index(part, self.counts), axis=1) * block
                total += int(np.prod(np.minimum(block, shape - corner), axis=1).sum())
        return total

    def __eq__(self, other) -> bool:
        if isinstance(other, ChunkBounds):
            return (self.shape, self.block) == (other.shape, other.block)
        if isinstance(other, (list, tuple)):
            return len(other) == self._n and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ChunkBounds(shape={self.shape}, block={self.block}: {self._n} chunks)"


def chunk_bounds(shape: tuple[int, ...], chunk_size: int) -> ChunkBounds:
    """[start, stop) in the flat grid of every chunk, in C order over the blocks
    (a :class:`ChunkBounds`: computed on demand, not held as a list)."""
    return ChunkBounds(shape, chunk_size)


def _dir_bytes(entries: int, name_len: int, block: int) -> int:
    """Bytes of a folder holding ``entries`` names of up to ``name_len`` characters: ext4's
    8 bytes plus the name (rounded to 4) per entry, "." and "..", in whole blocks, and
    twice that past one block (an indexed folder's leaf blocks may be half empty)."""
    need = 24 + entries * (8 + -(-name_len // 4) * 4)
    return block if need <= block else 2 * -(-need // block) * block


def disk_estimate(out_layout: dict, shape: tuple[int, ...], chunk_size: int, block: int,
                  coord_sizes=()) -> tuple[int, int, int]:
    """What a sweep's store takes on disk, at most: (bytes, files and folders, chunks).

    Counted from the store's layout rather than its data alone: each sweep chunk
    writes one Zarr chunk file per array, under nested folders
    ``<array>/c/<i0>/<i1>/...`` (Zarr format 3's default chunk keys, one folder per
    distinct prefix), and one marker; every file and folder takes whole blocks of the
    file system (``block``: ``os.statvfs``'s ``f_frsize``). A chunk's file holds at most
    its uncompressed bytes (compressed, or not written where it equals the fill value,
    it holds less). A sweep of 2e6 one-trajectory chunks thus needs about 20 blocks per
    chunk (~170 GB at 4 KiB), not the 582 MB of its numbers.

    Parameters
    ----------
    out_layout : dict
        name -> (shape after the trajectory axis, dtype), see ``_compute.layout``.
    shape : tuple of int
        The grid's shape.
    chunk_size : int
        Upper bound on the trajectories per chunk.
    block : int
        The file system's allocation unit in bytes.
    coord_sizes : iterable of int
        The lengths of the coordinate arrays (the grid and record axes).
    """
    def blocks(nbytes: int) -> int:
        return max(1, -(-nbytes // block)) * block

    bounds = ChunkBounds(shape, chunk_size)
    n_chunks = len(bounds)
    per_traj_block = math.prod(bounds.block)
    total = files = 0
    for tail, dtype in out_layout.values():
        tail = tuple(tail)
        counts = bounds.counts + tuple(1 if n else 0 for n in tail)
        chunk_bytes = per_traj_block * math.prod(tail) * np.dtype(dtype).itemsize
        n_files = math.prod(counts)
        total += n_files * blocks(chunk_bytes + 64)  # + a codec's frame header
        dirs = [(1, counts[0])]  # "c" and each level's folders, with their entries
        for level in range(1, len(counts)):
            dirs.append((math.prod(counts[:level]), counts[level]))
        for n_dirs, entries in dirs:
            total += n_dirs * _dir_bytes(entries, len(str(max(entries - 1, 0))), block)
        files += n_files + sum(n for n, _ in dirs)
        total += 2 * block  # the array's folder and its zarr.json
        files += 2
    marker = 160 + sum(len(name) + 72 for name in out_layout)  # + the source's name
    total += n_chunks * blocks(marker) + _dir_bytes(n_chunks + 1, len(f"{n_chunks}.json"), block)
    files += n_chunks + 2
    coord_sizes = list(coord_sizes)
    for size in coord_sizes:  # folder, zarr.json, c/, c/0
        total += 3 * block + blocks(8 * size)
        files += 4
    nodes = len(out_layout) + len(coord_sizes) + 2
    total += block + blocks(2048 * nodes + 2 * 25 * sum(coord_sizes))  # root and its zarr.json
    files += 2
    return total, files, n_chunks


_MISSING = object()


def _differences(stored, requested, key: str = ""):
    """(dotted key, stored value, requested value) of every entry where two identities differ;
    a missing entry is ``_MISSING``."""
    if isinstance(stored, dict) and isinstance(requested, dict):
        for k in sorted(set(stored) | set(requested)):
            yield from _differences(stored.get(k, _MISSING), requested.get(k, _MISSING),
                                    f"{key}.{k}" if key else str(k))
    elif stored != requested:
        yield key, stored, requested


def _show(value) -> str:
    """A short readable form of an identity entry: long lists by their length and range."""
    if value is _MISSING:
        return "(absent)"
    if (isinstance(value, list) and len(value) > 6
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        return f"{len(value)} values from {value[0]:.6g} to {value[-1]:.6g}"
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


class StoreMismatch(ValueError):
    """The store at a path was made by a different sweep (or is not a sweep store)."""


class SweepStore:
    """Open or create the store at ``path`` for a sweep with ``identity``.

    Parameters
    ----------
    path : str or Path
        Directory of the Zarr group (created if missing).
    identity : dict
        JSON-safe description of the sweep; an existing store must match it
        exactly, else StoreMismatch names the first differing entries.
    variables : dict
        name -> (dims, dtype, attrs) of every output: ``dims`` are the grid axes
        followed by the record axis, if any.
    coords : dict
        name -> 1-D array of every axis: the grid axes first, in C order.
    grid_dims : tuple of str
        The grid axes' names, in C order (the flat trajectory order).
    chunk_size : int
        Upper bound on the trajectories per chunk (see :func:`block_shape`).
    attrs : dict
        The Dataset's attributes, stored as the group's; ``pysharp_sweep`` holds
        the identity as JSON.
    create : bool
        False: open an existing store read-only (for :func:`pysharp.open_sweep`).
    source : str, optional
        What computed the chunks, when more than the identity's numbers say it (a
        loaded model's compiled modules, see ``_spec.source``): every marker records
        it, and a chunk whose marker records another is not finished (``read``), so
        no store mixes points of two models.
    """

    def __init__(self, path, identity: dict, variables: dict, coords: dict,
                 grid_dims: tuple[str, ...], chunk_size: int, attrs: dict,
                 create: bool = True, source: str | None = None) -> None:
        import zarr

        self.path = Path(path)
        self.source = source
        self.grid_shape = tuple(len(coords[d]) for d in grid_dims)
        self.n_traj = math.prod(self.grid_shape)
        self._bounds = chunk_bounds(self.grid_shape, chunk_size)
        self.block = self._bounds.block
        self._done = self.path / _DONE
        self.dtypes = {name: dtype for name, (_, dtype, _) in variables.items()}
        if not create:
            group = zarr.open_group(str(self.path), mode="r")
            self.arrays = {name: group[name] for name in variables if name in group}
            return
        if self.path.exists() and any(self.path.iterdir()):
            group = self._open_existing(zarr, identity)
        else:
            group = zarr.open_group(str(self.path), mode="w", zarr_format=3, attributes=attrs)
        self.arrays = {}
        created = False
        for name, values in coords.items():
            values = np.asarray(values)
            arr = group.get(name)
            if (arr is None or arr.shape != values.shape
                    or not np.array_equal(np.asarray(arr[...]), values)):
                arr = group.create_array(name, shape=values.shape, dtype=values.dtype,
                                         chunks=(max(1, values.size),), dimension_names=[name],
                                         overwrite=True)
                if values.size:
                    arr[...] = values
                created = True
        for name, (dims, dtype, var_attrs) in variables.items():
            tail = tuple(len(coords[d]) for d in dims[len(grid_dims):])
            shape, chunks = self.grid_shape + tail, self.block + tuple(max(1, n) for n in tail)
            arr = group.get(name)
            if (arr is None or arr.shape != shape or arr.chunks != chunks
                    or tuple(arr.metadata.dimension_names or ()) != tuple(dims)):
                # missing (a run stopped while creating the store) or foreign: (re)create;
                # a recreated array has no valid chunks, so their markers fail the check
                fill = {"bool": False, "int64": -2}.get(dtype, np.nan)
                arr = group.create_array(name, shape=shape, chunks=chunks, dtype=dtype,
                                         fill_value=fill, dimension_names=list(dims),
                                         attributes=var_attrs, overwrite=True)
                created = True
            self.arrays[name] = arr
        if not (self._done / "zarr.json").exists():
            # an empty Zarr group, so that Zarr and xarray see a known kind of node
            group.create_group(_DONE, attributes={
                "description": "completion markers of pysharp sweep chunks: <k>.json"})
            created = True
        if created:  # xarray.open_zarr reads consolidated metadata without a warning
            with warnings.catch_warnings():  # as xarray's to_zarr writes them for format 3
                warnings.filterwarnings("ignore", message="Consolidated metadata is currently")
                zarr.consolidate_metadata(str(self.path))

    def _open_existing(self, zarr, identity: dict):
        try:
            group = zarr.open_group(str(self.path), mode="r+")
        except Exception as exc:  # noqa: BLE001 - any unreadable directory is refused alike
            raise StoreMismatch(f"{self.path} exists and is not a Zarr store ({exc}); "
                                "choose another path") from None
        stored = dict(group.attrs)
        if stored.get("pysharp_format") != FORMAT:
            older = " (made by an older pysharp)" if "identity" in stored else ""
            raise StoreMismatch(f"{self.path} is not a pysharp sweep store{older}; "
                                "choose another path")
        self._check_same(json.loads(stored.get("pysharp_sweep", "{}")), identity)
        return group

    def _check_same(self, stored: dict, identity: dict) -> None:
        if stored == identity:
            return
        diff = list(_differences(stored, identity))
        top = sorted({key.split(".")[0].split("[")[0] for key, _, _ in diff})
        lines = [f"  {key}: stored {_show(a)}, requested {_show(b)}" for key, a, b in diff[:8]]
        if len(diff) > 8:
            lines.append(f"  ... and {len(diff) - 8} more")
        if any(key.startswith("model.modules") for key, _, _ in diff):
            lines.append("  (the model's compiled module differs: its header, a file the header "
                         "includes, the compiler or its flags changed since the store was made)")
        raise StoreMismatch(f"{self.path} holds a different sweep ({', '.join(top)} differ):\n"
                            + "\n".join(lines)
                            + "\nIt is left untouched: use a new store path, or delete this one "
                              "to start over.")

    @property
    def n_chunks(self) -> int:
        return len(self._bounds)

    def bounds(self, k: int) -> tuple[int, int]:
        """[start, stop) of chunk k in the flat grid."""
        return self._bounds[k]

    def _marker(self, k: int) -> Path:
        return self._done / f"{k}.json"

    def marked(self) -> Iterator[int]:
        """Chunks whose completion marker exists (their data not yet verified), in no
        particular order; read one directory entry at a time."""
        try:
            entries = os.scandir(self._done)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for entry in entries:
                stem, dot, suffix = entry.name.partition(".")
                if suffix == "json" and stem.isdigit() and int(stem) < self.n_chunks:
                    yield int(stem)

    def write(self, k: int, result: dict[str, np.ndarray]) -> None:
        """Store chunk k's arrays (leading axis: its trajectories), then mark it complete."""
        start, stop = self.bounds(k)
        region = self._bounds.region(k)
        block = tuple(s.stop - s.start for s in region)
        if set(result) != set(self.arrays):
            raise RuntimeError(f"chunk {k} returned {sorted(result)}, "
                               f"expected {sorted(self.arrays)}")
        sums = {}
        for name, arr in self.arrays.items():
            data = np.ascontiguousarray(result[name], dtype=self.dtypes[name])
            tail = arr.shape[len(block):]
            if data.shape != (stop - start, *tail):
                raise RuntimeError(f"chunk {k}: {name} has shape {data.shape}")
            arr[region] = data.reshape(block + tail)
            sums[name] = _digest(data)
        marker = {"chunk": k, "start": start, "stop": stop, "sha256": sums}
        if self.source is not None:
            marker["source"] = self.source
        tmp = self._marker(k).with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(marker))
            os.replace(tmp, self._marker(k))
        finally:  # a full disk: no half-written marker is left behind
            tmp.unlink(missing_ok=True)

    def read(self, k: int, *, forget: bool = True) -> dict[str, np.ndarray] | None:
        """Chunk k's arrays (leading axis: its trajectories) if its marker exists and every
        checksum matches, else None.

        With ``forget`` a chunk that fails the check loses its marker, so it is recomputed.
        """
        try:
            marker = json.loads(self._marker(k).read_text())
            start, stop = self.bounds(k)
            region = self._bounds.region(k)
            out = {}
            for name, arr in self.arrays.items():
                block = np.asarray(arr[region])
                out[name] = block.reshape((stop - start,) + block.shape[len(region):])
            ok = (set(out) == set(self.dtypes)
                  and (marker["start"], marker["stop"]) == (start, stop)
                  and marker.get("source") == self.source
                  and all(_digest(out[name].astype(self.dtypes[name], copy=False))
                          == marker["sha256"][name] for name in self.dtypes))
        except Exception:  # noqa: BLE001 - unreadable, truncated or undecodable: recompute
            ok = False
        if not ok:
            if forget:
                self._marker(k).unlink(missing_ok=True)
            return None
        return out
