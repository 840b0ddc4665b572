"""How much memory this process may still allocate: the system's and its cgroup's limits.

The sweeps size their chunks by it, and the XLA backend refuses in words an array that
would not fit (a dense Hessian of a large network, a Krylov basis too many vectors long).
"""

from __future__ import annotations

import os
from pathlib import Path


def _read_int(path: str | Path) -> int | None:
    try:
        text = Path(path).read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


def cgroup_room(cgroup: str | Path = "/proc/self/cgroup",
                root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes this process may still use under the memory limits of its cgroup (None: no
    limit found).

    ``cgroup`` (``/proc/self/cgroup``) names the process's own cgroup: for cgroup v2
    the line ``0::<path>``, whose limit is ``memory.max`` less ``memory.current`` in
    ``<root>/<path>`` (or ``<root>/unified/<path>``); for v1 the line of the
    ``memory`` controller, ``memory.limit_in_bytes`` less ``memory.usage_in_bytes`` in
    ``<root>/memory/<path>``. A limit set on an ancestor binds too, so every folder
    from the cgroup's up to the root is read, and the root's own files (a container
    sees its cgroup there); the smallest room wins.
    """
    root = Path(root)
    places = []
    try:
        lines = Path(cgroup).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            bases, files = [root, root / "unified"], ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            bases, files = [root / "memory"], ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        own = Path(path.strip().lstrip("/"))
        places += [(base / folder, files) for base in bases for folder in (own, *own.parents)]
    places += [(root, ("memory.max", "memory.current")),
               (root / "memory", ("memory.limit_in_bytes", "memory.usage_in_bytes"))]
    rooms = []
    for folder, (limit, usage) in dict.fromkeys(places):
        cap, used = _read_int(folder / limit), _read_int(folder / usage)
        if cap is not None and used is not None and cap < 1 << 60:  # v1's "no limit": ~2**63
            rooms.append(max(0, cap - used))
    return min(rooms) if rooms else None


def available_memory(cgroup: str | Path = "/proc/self/cgroup",
                     root: str | Path = "/sys/fs/cgroup") -> int | None:
    """Bytes this process can still allocate (None: unknown).

    The smallest of the system's available memory (psutil if installed, else
    ``MemAvailable`` of /proc/meminfo, else ``sysconf``'s free pages) and the
    room left under the memory limits of the process's own cgroup and its ancestors
    (:func:`cgroup_room`, which takes ``cgroup`` and ``root``).
    """
    found = []
    try:
        import psutil
        found.append(int(psutil.virtual_memory().available))
    except ImportError:
        try:
            with open("/proc/meminfo") as f:
                line = next(x for x in f if x.startswith("MemAvailable:"))
            found.append(int(line.split()[1]) * 1024)
        except (OSError, StopIteration, ValueError):
            try:
                found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
            except (ValueError, OSError, AttributeError):
                pass
    room = cgroup_room(cgroup, root)
    if room is not None:
        found.append(room)
    return min(found) if found else None
