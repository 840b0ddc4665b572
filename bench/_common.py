"""Pieces shared by the benchmark scripts: importing pysharp, load monitoring, checks."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent

#: A measurement during which other processes used more than this fraction of
#: the machine's CPU time is flagged with "!" (the number is not trustworthy).
BUSY_THRESHOLD = 0.15


def import_pysharp():
    """Import pysharp with its compiled core; returns (module, note or None).

    ``python -m bench.<script>`` puts the repository root first on sys.path, so
    the source tree's ``pysharp/`` shadows the installed package. When the
    source tree has no built ``_core`` (a non-editable install), fall back to
    the installed copy.
    """
    import pysharp

    if pysharp.build_info().get("available"):
        return pysharp, None
    first_reason = pysharp.build_info().get("reason")
    pkg_dir = Path(pysharp.__file__).resolve().parent
    if pkg_dir.parent != _REPO:
        raise ImportError(first_reason)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _REPO]
    for name in [m for m in sys.modules if m == "pysharp" or m.startswith("pysharp.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        import pysharp as installed
    except ImportError:
        sys.path[:] = saved_path
        raise ImportError(first_reason) from None
    finally:
        # Keep the repository root importable (for bench.*) after the switch.
        if str(_REPO) not in sys.path:
            sys.path.append(str(_REPO))
    if not installed.build_info().get("available"):
        raise ImportError(installed.build_info().get("reason", first_reason))
    note = (f"source tree {pkg_dir} has no built _core; using the installed pysharp at "
            f"{Path(installed.__file__).resolve().parent}")
    return installed, note


class LoadMonitor:
    """CPU time used by *other* processes while a measurement runs.

    Reads the machine-wide busy time from /proc/stat and subtracts this
    process's own CPU time (os.times), so a concurrent build or a second
    benchmark shows up as a fraction of the machine (0 = idle, 1 = all cores).
    None where /proc/stat is unavailable or the window is under 0.2 s.
    """

    _tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    min_window_s = 0.2

    @staticmethod
    def _busy():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)   # idle + iowait
        return (sum(fields[:8]) - idle) / LoadMonitor._tick

    def __enter__(self):
        t = os.times()
        self.t0, self.self0, self.busy0 = time.perf_counter(), t.user + t.system, self._busy()
        return self

    def __exit__(self, *exc):
        t = os.times()
        wall = time.perf_counter() - self.t0
        busy1 = self._busy()
        self.other = None
        # /proc/stat and os.times count clock ticks (10 ms): shorter windows are noise.
        if self.busy0 is not None and busy1 is not None and wall >= self.min_window_s:
            own = t.user + t.system - self.self0
            cores = os.cpu_count() or 1
            self.other = max(0.0, (busy1 - self.busy0 - own) / (wall * cores))
        return False


def timed(fn, repeats: int = 3) -> tuple[float, float | None]:
    """Best wall time of ``repeats`` calls of fn after one warm-up call (compilation,
    caches), and the other processes' CPU load during that best call."""
    fn()
    best, load = float("inf"), None
    for _ in range(repeats):
        with LoadMonitor() as mon:
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
        if dt < best:
            best, load = dt, mon.other
    return best, load


def record_check(checks: list, row: str, peer: str, dev: float, tol: float) -> bool:
    """Append an agreement check {row, peer, rel_dev, ok} to ``checks``; return ok
    (``dev <= tol``), so a caller times the peer only when it agreed."""
    ok = dev <= tol
    checks.append({"row": row, "peer": peer, "rel_dev": dev, "ok": ok})
    return ok
