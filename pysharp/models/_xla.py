"""Any JAX network as a model, run untraced by XLA: :func:`from_jax` and :class:`XlaModel`.

The loss is the user's own function, called by JAX as written (convolutions, scans,
gathers, batch statistics, any construct JAX differentiates); pysharp only flattens the
parameter pytree with ``jax.flatten_util.ravel_pytree`` and runs its kernels, Lanczos and
trajectory engine in XLA (``pysharp._backends._jax``). ``compile=True`` keeps the traced
C++ path of :mod:`pysharp.models._from_jax` for small losses, where the compiled core wins.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._jax import x64
from ._base import ScaleInvariantModel
from ._from_jax import JaxModel
from ._from_jax import from_jax as _compiled_from_jax
from ._registry import ModelEntry, register


def _leaf_paths(params) -> list[str]:
    """"/"-joined key paths of the leaves of ``params``, in ``ravel_pytree``'s order."""
    import jax

    def name(key) -> str:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        return str(key)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return ["/".join(name(k) for k in path) for path, _ in leaves]


def _group_index(groups, paths: list[str], sizes: list[int]) -> np.ndarray | None:
    """The group of each coordinate of w, (D,) ints 0..G-1, for ``from_jax``'s ``groups``:
    None for the whole of w, "leaves" for a group per leaf, or a list whose items are a
    leaf path or a list of leaf paths (one group each) covering every leaf once."""
    if groups is None:
        return None
    if isinstance(groups, str):
        if groups != "leaves":
            raise ValueError(f"groups must be None, 'leaves' or a list of leaf paths, got "
                             f"{groups!r}")
        leaf_group = list(range(len(paths)))
    else:
        if not isinstance(groups, (list, tuple)) or not groups:
            raise ValueError("groups must be None, 'leaves' or a non-empty list of leaf paths "
                             "(each item a path or a list of paths)")
        leaf_group = [-1] * len(paths)
        for g, item in enumerate(groups):
            for path in [item] if isinstance(item, str) else list(item):
                if path not in paths:
                    raise ValueError(f"groups[{g}] names {path!r}, which is no leaf of params; "
                                     f"the leaves are {paths}")
                i = paths.index(path)
                if leaf_group[i] >= 0:
                    raise ValueError(f"leaf {path!r} is in groups[{leaf_group[i]}] and "
                                     f"groups[{g}]: each leaf belongs to one group")
                leaf_group[i] = g
        missing = [p for p, g in zip(paths, leaf_group) if g < 0]
        if missing:
            raise ValueError(f"groups leave out the leaves {missing}: every leaf must be in a "
                             "group (the loss is invariant to each group's scale); give them "
                             "a group of their own")
    if len(set(leaf_group)) < 2:
        return None
    return np.repeat(np.asarray(leaf_group, dtype=np.int32), sizes)


class XlaModel(ScaleInvariantModel):
    """A JAX loss of a parameter pytree, run by XLA (``backend="jax"``): see :func:`from_jax`.

    Every kernel takes the flat w (D,) or (B, D) of ``ravel_pytree(params)``; ``unravel(w)``
    gives the pytree back. The kernels are JAX's own autodiff of the loss as written, so a
    loss that is only nearly scale-invariant (a BatchNorm with an epsilon) is run as it is.

    Attributes
    ----------
    loss_fn : callable
        The user's ``loss(params, **data)``.
    params : pytree
        The example parameters the model was built from.
    data : dict
        The data arrays (JAX arrays) and static values bound to the loss.
    leaf_paths : list of str
        The leaves' key paths, "/"-joined, in the order of w.
    groups : ndarray of int, shape (D,), or None
        The group of each coordinate of w for a loss invariant to the scale of each of
        several groups separately (``Trajectory.group_norm2`` records their norms).
    invariance : dict
        What the build measured at ``params``: ``rel_change`` |L(2w) - L(w)| / |L(w)| and
        ``cos_grad_w`` the cosine of grad L(w) and w (both 0 for an exactly
        scale-invariant loss).
    """

    _backends = ("jax",)
    _backends_why = "a model written in JAX runs in XLA; from_jax(..., compile=True) " \
                    "traces small losses to the compiled core"

    def __init__(self, loss: Callable, params: Any, *, groups=None, **data) -> None:
        super().__init__()
        import jax
        from jax.flatten_util import ravel_pytree

        leaves = jax.tree_util.tree_leaves(params)
        if not leaves:
            raise ValueError("params has no arrays")
        for path, leaf in zip(_leaf_paths(params), leaves):
            kind = np.asarray(leaf).dtype.kind if not hasattr(leaf, "dtype") else \
                np.dtype(leaf.dtype).kind
            if kind != "f":
                raise TypeError(f"params leaf {path!r} is not a float array (dtype kind "
                                f"{kind!r}): every leaf of params is a parameter")
        with x64():
            flat, unravel = ravel_pytree(jax.tree_util.tree_map(
                lambda a: jax.numpy.asarray(a, dtype=jax.numpy.float64), params))
        self.loss_fn = loss
        self.params = params
        self._unravel = unravel
        self._w0 = np.asarray(flat)
        self.leaf_paths = _leaf_paths(params)
        sizes = [int(np.size(leaf)) for leaf in leaves]
        self.groups = _group_index(groups, self.leaf_paths, sizes)
        self._groups_arg = groups
        self._static = {k: v for k, v in data.items() if _static(v)}
        self.data = {k: v for k, v in data.items() if not _static(v)}
        for name, value in self.data.items():
            a = np.asarray(value)
            if a.dtype.kind not in "fiub":
                raise TypeError(f"data {name!r} must be a real or integer array, got dtype "
                                f"{a.dtype}")
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                bad = np.argwhere(~np.isfinite(a))[0]
                raise ValueError(f"data {name!r} has a non-finite entry at index "
                                 f"{tuple(int(i) for i in bad)}")
        self.invariance: dict[str, float] = {}

    @property
    def dim(self) -> int:
        return int(self._w0.size)

    @property
    def n_groups(self) -> int:
        """G: 1, or the number of groups declared with ``groups``."""
        return 1 if self.groups is None else int(self.groups.max()) + 1

    def _make_core(self, suffix: str, module: Any) -> Any:  # pragma: no cover - _backends
        raise NotImplementedError("an XlaModel has no compiled core")

    def _jax_loss(self) -> tuple[Callable, Any, np.ndarray | None]:
        import jax.numpy as jnp

        loss, unravel, static = self.loss_fn, self._unravel, self._static
        with x64():
            data = {k: jnp.asarray(v) for k, v in self.data.items()}

        def f(w, d):
            # float data in w's precision: XLA's convolutions refuse mixed precisions
            d = {k: v.astype(w.dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v
                 for k, v in d.items()}
            return loss(unravel(w), **d, **static)
        return f, data, self.groups

    def unravel(self, w) -> Any:
        """The parameter pytree of a flat w (D,), as JAX arrays of w's precision."""
        with x64():
            return self._unravel(w)

    def initial_point(self) -> np.ndarray:
        """The flat w (D,) of the ``params`` the model was built from, float64."""
        return self._w0.copy()

    def spec(self) -> dict:
        """What rebuilds the model in this process: ``XlaModel(**spec)`` less "model". The
        loss is the function itself (a sweep stores its name and its code's digest)."""
        return {"model": "from_jax", "loss": self.loss_fn, "params": self.params,
                "groups": self._groups_arg, **self.data, **self._static}

    def __repr__(self) -> str:
        def shown(v):
            return str(tuple(np.shape(v))) if np.ndim(v) else repr(v)
        data = ", ".join(f"{k}={shown(v)}" for k, v in {**self.data, **self._static}.items())
        name = getattr(self.loss_fn, "__qualname__", "loss")
        groups = f", groups={self.n_groups}" if self.groups is not None else ""
        return f"XlaModel({name}: {data}, leaves={len(self.leaf_paths)}, dim={self.dim}{groups})"


def _traced(loss: Callable, params, *, groups, **options) -> JaxModel:
    """``from_jax(..., compile=True)``: one array goes to the traced path as it is; a pytree
    is flattened, the loss traced through its ``unravel`` (slices and reshapes the
    translation knows), and leaf groups become the contiguous blocks they are."""
    import jax
    from jax.flatten_util import ravel_pytree

    if not isinstance(params, (dict, list, tuple)) and hasattr(params, "shape") or \
            isinstance(params, np.ndarray):
        return _compiled_from_jax(loss, params, groups=groups, **options)
    paths = _leaf_paths(params)
    with x64():
        flat, unravel = ravel_pytree(jax.tree_util.tree_map(
            lambda a: jax.numpy.asarray(a, dtype=jax.numpy.float64), params))
    if groups is not None and not isinstance(groups, int):
        sizes = [int(np.size(leaf)) for leaf in jax.tree_util.tree_leaves(params)]
        ids = _group_index(groups, paths, sizes)
        if ids is not None:
            change = np.flatnonzero(np.diff(ids)) + 1
            starts = np.concatenate([[0], change])
            if not np.array_equal(ids[starts], np.arange(len(starts))):
                raise ValueError("compile=True declares groups as contiguous blocks of w in "
                                 "order: list the leaves of each group together, in the order "
                                 f"of params ({paths}), or use compile=False")
            groups = np.diff(np.concatenate([starts, [ids.size]])).tolist()
        else:
            groups = None

    @functools.wraps(loss)
    def flat_loss(w, **d):
        return loss(unravel(w), **d)

    model = _compiled_from_jax(flat_loss, np.asarray(flat), groups=groups, **options)
    def unravel_x64(w):
        with x64():
            return unravel(np.asarray(w, dtype=np.float64))
    model.unravel = unravel_x64
    return model


def _static(v) -> bool:
    return isinstance(v, (bool, int, np.integer, str)) and not isinstance(v, np.ndarray)


def _measure_invariance(model: XlaModel) -> dict[str, float]:
    """|L(2w) - L(w)| / |L(w)| and cos(grad L(w), w) at the model's own params, and the
    same per group: what a scale-invariant loss makes 0."""
    w = model.initial_point()
    loss, g = model.loss_and_grad(w)
    loss2 = model.loss(2 * w)
    if not (np.isfinite(loss) and np.all(np.isfinite(g))):
        raise ValueError(f"the loss or its gradient is not finite at params (loss {loss}): "
                         "the model needs a point where it is defined")
    out = {"rel_change": float(abs(loss2 - loss) / max(abs(loss), np.finfo(float).tiny)),
           "cos_grad_w": float(abs(g @ w) / max(np.linalg.norm(g) * np.linalg.norm(w),
                                                 np.finfo(float).tiny))}
    if model.groups is not None:
        worst = 0.0
        for k in range(model.n_groups):
            scaled = np.where(model.groups == k, 2 * w, w)
            worst = max(worst, float(abs(model.loss(scaled) - loss) /
                                     max(abs(loss), np.finfo(float).tiny)))
        out["rel_change_per_group"] = worst
    return out


#: Above this relative change of the loss under w -> 2w, from_jax warns that the loss is not
#: scale-invariant (a BatchNorm's epsilon changes it by about epsilon / variance).
INVARIANCE_WARN = 1e-3


def from_jax(loss: Callable, params, *, compile: bool = False, groups=None,
             check: bool = True, dtype="float64", check_points: int = 3,
             **data) -> XlaModel | JaxModel:
    """A model from a loss written in JAX.

    Parameters
    ----------
    loss : callable
        ``loss(params, **data) -> scalar``, any JAX code (convolutions, ``scan``,
        integer-label cross-entropy, batch statistics, ...).
    params : pytree
        The parameters: one array, or dicts, lists and tuples of arrays (as Flax, Equinox
        or plain JAX code holds them). The model's kernels take the flat w of
        ``jax.flatten_util.ravel_pytree(params)`` (D values); ``model.unravel(w)`` gives
        the pytree back and ``model.initial_point()`` the flat params.
    compile : bool
        False (the default): the loss runs untraced in XLA (``backend="jax"``), with
        JAX's autodiff for every derivative; no C++ compiler is needed. True: the loss is
        traced to C++ and compiled into the core (:func:`pysharp.models._from_jax.from_jax`,
        a :class:`JaxModel`), for small losses of the supported primitives, where the
        compiled engine is many times faster.
    groups : None, "leaves" or list
        Invariance declared: None, to the scale of the whole of w; "leaves", of each leaf
        separately; a list, of each group of leaves, an item being a leaf path ("/"-joined
        keys, e.g. "conv1/w"; ``model.leaf_paths`` lists them) or a list of paths. With
        ``compile=True``: an int G (equal blocks), as that path takes.
    check : bool
        Untraced: measure the loss's invariance at ``params`` (``model.invariance``) and warn
        when L(2w) differs from L(w) by more than 1e-3 relative. Compiled: compare the
        generated model with JAX (see the compiled path).
    dtype, check_points
        The compiled path's (its precision and the points it checks); unused untraced,
        where every call computes in the dtype of its w.
    **data
        Arrays (passed to the loss by keyword, not baked into the compiled programs) and
        static Python ints, bools and strings.

    Returns
    -------
    XlaModel, or JaxModel with ``compile=True``.

    Examples
    --------
    >>> model = ps.models.from_jax(cnn_loss, params, X=images, y=labels)  # doctest: +SKIP
    >>> traj = ps.run_gd_wd(model, model.initial_point(), lr=0.1, wd=5e-4,
    ...                     steps=2000, sharpness_every=100)  # doctest: +SKIP
    """
    import jax  # noqa: F401 - ImportError here says what is missing

    if compile:
        return _traced(loss, params, groups=groups, check=check, dtype=dtype,
                       check_points=check_points, **data)
    model = XlaModel(loss, params, groups=groups, **data)
    if check:
        model.invariance = _measure_invariance(model)
        worst = max(model.invariance["rel_change"],
                    model.invariance.get("rel_change_per_group", 0.0))
        if worst > INVARIANCE_WARN:
            warnings.warn(
                f"from_jax: the loss changes by {worst:.2g} (relative) when "
                f"{'a group of ' if model.groups is not None else ''}the parameters is scaled "
                "by 2: it is not scale-invariant, which the tools on the sphere (sharpness, "
                "effective LR, projected GD) assume. Normalise the layers (BatchNorm, "
                "weight normalisation) or declare the groups that are invariant.",
                UserWarning, stacklevel=2)
    return model


register(ModelEntry("from_jax", XlaModel, XlaModel,
                    plot_metrics=("eos_entry_step", "final_sharpness", "final_loss")))

__all__ = ["from_jax", "XlaModel"]
