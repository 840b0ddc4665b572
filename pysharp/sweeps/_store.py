"""The resumable Zarr store of a sweep.

Layout of ``path.zarr``: one Zarr array per output, trajectories flat along
axis 0 and chunked exactly like the sweep, so a sweep chunk is one Zarr chunk
of each array and no two chunks ever share bytes. The group's attributes hold
the sweep's identity (grid, model spec, settings, pysharp version, backend).
A chunk counts as finished only once ``_pysharp_done/<k>.json`` exists: it is
written after the data, atomically (write to a temporary file, then rename),
and holds the SHA-256 of every array's bytes for the chunk, which are checked
when the chunk is read back, so a truncated or altered chunk is recomputed,
never silently used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

FORMAT = "pysharp-sweep/1"
_DONE = "_pysharp_done"


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def chunk_bounds(n_traj: int, chunk_size: int) -> list[tuple[int, int]]:
    """[start, stop) of every chunk of the flat grid."""
    return [(a, min(a + chunk_size, n_traj)) for a in range(0, n_traj, chunk_size)]


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
    layout : dict
        name -> (shape after the trajectory axis, dtype), see ``_compute.layout``.
    n_traj, chunk_size : int
        Trajectories in total and per chunk.
    """

    def __init__(self, path, identity: dict, layout: dict, n_traj: int, chunk_size: int) -> None:
        import zarr

        self.path = Path(path)
        self.layout, self.n_traj, self.chunk_size = layout, n_traj, chunk_size
        self._bounds = chunk_bounds(n_traj, chunk_size)
        self._done = self.path / _DONE
        if self.path.exists() and any(self.path.iterdir()):
            try:
                group = zarr.open_group(str(self.path), mode="r+")
            except Exception as exc:  # noqa: BLE001 - any unreadable directory is refused alike
                raise StoreMismatch(f"{self.path} exists and is not a Zarr store ({exc}); "
                                    "choose another path") from None
            stored = dict(group.attrs)
            if stored.get("format") != FORMAT:
                raise StoreMismatch(f"{self.path} is not a pysharp sweep store; choose another path")
            self._check_same(stored.get("identity", {}), identity)
        else:
            group = zarr.open_group(str(self.path), mode="w",
                                    attributes={"format": FORMAT, "identity": identity})
        self.arrays = {}
        for name, (tail, dtype) in layout.items():
            shape, chunks = (n_traj, *tail), (chunk_size, *tail)
            arr = group.get(name)
            if arr is None or arr.shape != shape or arr.chunks != chunks:
                # missing (a run stopped while creating the store) or foreign: (re)create;
                # a recreated array has no valid chunks, so their markers fail the check
                fill = {"bool": False, "int64": -2}.get(dtype, np.nan)
                arr = group.create_array(name, shape=shape, chunks=chunks, dtype=dtype,
                                         fill_value=fill, overwrite=True)
            self.arrays[name] = arr
        self._done.mkdir(exist_ok=True)

    def _check_same(self, stored: dict, identity: dict) -> None:
        if stored == identity:
            return
        keys = sorted(set(stored) | set(identity))
        diff = [k for k in keys if stored.get(k) != identity.get(k)]
        lines = []
        for k in diff[:4]:
            a, b = json.dumps(stored.get(k)), json.dumps(identity.get(k))
            lines.append(f"  {k}: stored {a[:120]}, requested {b[:120]}")
        raise StoreMismatch(f"{self.path} holds a different sweep ({', '.join(diff)} differ):\n"
                            + "\n".join(lines)
                            + "\nIt is left untouched: use a new store path, or delete this one "
                              "to start over.")

    @property
    def n_chunks(self) -> int:
        return len(self._bounds)

    def bounds(self, k: int) -> tuple[int, int]:
        return self._bounds[k]

    def _marker(self, k: int) -> Path:
        return self._done / f"{k}.json"

    def marked(self) -> list[int]:
        """Chunks whose completion marker exists (their data not yet verified)."""
        return sorted(int(p.stem) for p in self._done.glob("*.json") if p.stem.isdigit()
                      and int(p.stem) < self.n_chunks)

    def write(self, k: int, result: dict[str, np.ndarray]) -> None:
        """Store chunk k's arrays, then mark it complete (atomically, with checksums)."""
        start, stop = self.bounds(k)
        if set(result) != set(self.layout):
            raise RuntimeError(f"chunk {k} returned {sorted(result)}, expected {sorted(self.layout)}")
        sums = {}
        for name, arr in self.arrays.items():
            data = np.ascontiguousarray(result[name], dtype=self.layout[name][1])
            if data.shape != (stop - start, *self.layout[name][0]):
                raise RuntimeError(f"chunk {k}: {name} has shape {data.shape}")
            arr[start:stop] = data
            sums[name] = _digest(data)
        marker = {"chunk": k, "start": start, "stop": stop, "sha256": sums}
        tmp = self._marker(k).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(marker))
        os.replace(tmp, self._marker(k))

    def read(self, k: int) -> dict[str, np.ndarray] | None:
        """Chunk k's arrays if its marker exists and every checksum matches, else None.

        A chunk that fails the check loses its marker, so it is recomputed.
        """
        try:
            marker = json.loads(self._marker(k).read_text())
            start, stop = self.bounds(k)
            out = {name: np.asarray(arr[start:stop]) for name, arr in self.arrays.items()}
            ok = (marker["start"], marker["stop"]) == (start, stop) and all(
                _digest(out[name].astype(self.layout[name][1], copy=False)) == marker["sha256"][name]
                for name in self.layout)
        except Exception:  # noqa: BLE001 - unreadable, truncated or undecodable: recompute
            ok = False
        if not ok:
            self._marker(k).unlink(missing_ok=True)
            return None
        return out
