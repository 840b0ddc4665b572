"""Parameter groups: the contiguous blocks of w to whose scale a loss is invariant, each
separately, as G + 1 offsets 0 = b_0 < b_1 < ... < b_G = D (group k is w[b_k:b_(k+1)]).

A model header declares them with ``n_groups()`` (G equal blocks) and, for blocks of
unequal sizes, ``group_begin(k)`` (core/config.hpp); ``from_jax(groups=...)`` and
``check(groups=...)`` take them in the forms :func:`group_bounds` reads.
"""

from __future__ import annotations

import numbers

import numpy as np

_FORMS = "an int G (G equal blocks), a list of sizes or a list of (start, stop) ranges"


def _whole(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _as_range(x):
    """(start, stop) of a pair of ints or a range of step 1; None for anything else."""
    if isinstance(x, range):
        return (x.start, x.stop) if x.step == 1 else None
    if isinstance(x, (tuple, list)) and len(x) == 2 and all(_whole(v) for v in x):
        return int(x[0]), int(x[1])
    return None


def group_bounds(groups, dim: int) -> np.ndarray:
    """The (G + 1,) offsets of ``groups`` over w of ``dim`` values.

    ``groups`` is an int G (G equal contiguous blocks: G must divide ``dim``), a list of
    G positive sizes summing to ``dim`` (``[30, 6]``), or a list of G ``(start, stop)``
    ranges (pairs or ``range`` objects) that tile ``w[0:dim]`` contiguously, in order
    (``[(0, 30), (30, 36)]``). Raises ValueError naming what is wrong: a gap, an overlap,
    an empty group, the wrong total.
    """
    D = int(dim)
    if _whole(groups):
        G = int(groups)
        if G < 1:
            raise ValueError(f"groups must be >= 1, got {G}")
        if D % G:
            raise ValueError(f"groups={G}: {G} equal blocks do not divide the dim {D}; for "
                             f"blocks of unequal sizes pass their sizes (a list summing to "
                             f"{D}) or their (start, stop) ranges")
        return np.arange(G + 1, dtype=np.int64) * (D // G)
    if isinstance(groups, (str, bytes, dict)) or not hasattr(groups, "__len__"):
        raise ValueError(f"groups must be {_FORMS}; got {type(groups).__name__} {groups!r}")
    items = [x.tolist() if isinstance(x, np.ndarray) else x for x in groups]
    if not items:
        raise ValueError(f"groups is empty; it must be {_FORMS}")
    if all(_whole(s) for s in items):
        sizes = [int(s) for s in items]
        for k, s in enumerate(sizes):
            if s < 1:
                raise ValueError(f"groups: the size of group {k} is {s}; sizes must be >= 1")
        if sum(sizes) != D:
            raise ValueError(f"groups: the sizes {sizes} sum to {sum(sizes)}, not to the dim "
                             f"{D}")
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ranges = [_as_range(x) for x in items]
    for k, (x, r) in enumerate(zip(items, ranges)):
        if r is None:
            raise ValueError(f"groups must be {_FORMS}, not a mix; entry {k} is {x!r}")
        if r[1] <= r[0]:
            raise ValueError(f"groups: range {k} ({r[0]}, {r[1]}) is empty")
    if ranges[0][0] != 0:
        raise ValueError(f"groups: range 0 starts at {ranges[0][0]}, so w[0:{ranges[0][0]}] "
                         "is in no group; the ranges must tile w from 0, in order")
    for k in range(1, len(ranges)):
        (a, b), (c, d) = ranges[k - 1], ranges[k]
        if c > b:
            raise ValueError(f"groups: a gap between range {k - 1} ({a}, {b}) and range {k} "
                             f"({c}, {d}): w[{b}:{c}] is in no group")
        if c < b:
            raise ValueError(f"groups: range {k - 1} ({a}, {b}) and range {k} ({c}, {d}) "
                             f"overlap at w[{max(a, c)}:{min(b, d)}]; the ranges must tile w "
                             "contiguously, in order")
    stop = ranges[-1][1]
    if stop != D:
        raise ValueError(f"groups: the last range stops at {stop}, but the dim is {D}"
                         + (f": w[{stop}:{D}] is in no group" if stop < D else ""))
    return np.array([0] + [r[1] for r in ranges], dtype=np.int64)


def equal_blocks(bounds: np.ndarray) -> bool:
    """Whether the groups of ``bounds`` are all of one size (what ``n_groups()`` alone
    declares)."""
    return len(set(np.diff(bounds).tolist())) == 1


def declared_group_bounds(model, dtype) -> np.ndarray:
    """The groups a model declares (``model.group_bounds``: a loaded model's header, a
    BNTwoLayerNet's rows); one group, the whole w, for a model that declares none."""
    bounds = getattr(model, "group_bounds", None)
    if bounds is None:
        try:
            bounds = getattr(model._core(dtype), "group_bounds", None)
        except Exception:  # noqa: BLE001 - a model without a compiled core
            bounds = None
    if bounds is None:
        return np.array([0, int(model.dim)], dtype=np.int64)
    return np.asarray(bounds, dtype=np.int64)
