"""Your own model: a C++ header compiled at run time, with every tool of pysharp."""

from __future__ import annotations

import numbers
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from .._engine.validation import check_finite
from . import _compiler
from ._base import ScaleInvariantModel
from ._compiler import ModelCompileError, compile_model, model_names
from ._registry import ModelEntry, register
from ._square_loss import SGD_PLOTS, SquareLossModel

_DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32)}


def _dtype_name(dtype) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype)
    if name not in _DTYPES:
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    return name


_PACKAGE = str(Path(__file__).resolve().parent.parent)


def _caller_stacklevel() -> int:
    """The ``stacklevel`` of :func:`warnings.warn` that names the first frame outside
    pysharp: the user's line, however deep inside pysharp the warning is raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def check_real_data(name: str, value, dtype) -> None:
    """Refuse data ``value`` of field ``name`` with a non-finite entry (ValueError naming
    the first's index), and warn where it is float data of less than double precision
    for a ``dtype`` float64 model: the model takes the values as they are (exactly), so it
    computes with data rounded to the lower precision, which it must not do silently
    (docs/conventions.rst, "Precision and shapes")."""
    a = np.asarray(value)
    if a.dtype.kind != "f":
        return
    check_finite(a, name)
    if a.dtype.itemsize < 8 and np.dtype(dtype) == np.float64:
        warnings.warn(
            f"{name} is {a.dtype} data for a float64 model: its values are taken as they are, "
            f"so the model computes with data rounded to {a.dtype} (relative error up to "
            f"{float(np.finfo(a.dtype).eps) / 2:.0e}). Pass the data in float64 if you have "
            "them (JAX arrays are float32 unless jax_enable_x64 is set), or load the model "
            "with dtype='float32'; convert them yourself (np.float64) to keep them and "
            "silence this warning.", UserWarning, stacklevel=_caller_stacklevel())


def _validated(fields: list[dict], data: dict[str, Any], header: Path,
               dtype=np.float64) -> dict[str, Any]:
    """The data checked against the model's declared fields: float arrays as float64,
    int arrays as int32, scalars as Python numbers. ValueError naming the field (and
    the first non-finite entry); a warning for float32 data of a float64 model
    (:func:`check_real_data`)."""
    declared = {f["name"]: f for f in fields}
    missing = [n for n in declared if n not in data]
    extra = [n for n in data if n not in declared]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unknown {', '.join(extra)}")
        raise ValueError(f"{header.name}: {'; '.join(parts)}; its PYSHARP_MODEL declares "
                         f"{', '.join(declared) or 'no fields'}")
    out: dict[str, Any] = {}
    extents: dict[str, tuple[int, str]] = {}
    for name, f in declared.items():  # scalars first: an int scalar may be an extent
        if f["kind"] != "scalar":
            continue
        value = data[name]
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value.item()
        if f["dtype"] == "int":
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not float(value).is_integer():
                raise ValueError(f"{name} must be an integer, got {value!r}")
            out[name] = int(value)
            extents[name] = (int(value), name)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                    not np.isfinite(float(value)):
                raise ValueError(f"{name} must be a finite real number, got {value!r}")
            check_real_data(name, value, dtype)
            out[name] = float(value)
    for name, f in declared.items():
        if f["kind"] != "array":
            continue
        a = np.asarray(data[name])
        integer = np.dtype(f["dtype"]).kind in "iu"
        if integer:
            if a.dtype.kind not in "iu":
                raise ValueError(f"{name} must be an integer array, got dtype {a.dtype}")
            if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
                raise ValueError(f"{name} has entries outside the int32 range")
            a = np.ascontiguousarray(a, dtype=np.int32)
        else:
            if a.dtype.kind not in "fiu":
                raise ValueError(f"{name} must be a real array, got dtype {a.dtype}")
            check_real_data(name, a, dtype)
            a = np.ascontiguousarray(a, dtype=np.float64)
        axes = f["extents"]
        if a.ndim != len(axes):
            shape = ", ".join(axes)
            raise ValueError(f"{name} must have {len(axes)} axes ({shape}), got shape {a.shape}")
        if a.size == 0:  # a loss over no data is NaN, or a false "undefined there"
            axis = a.shape.index(0)
            raise ValueError(f"{name} is empty (shape {a.shape}): axis {axis} ({axes[axis]}) has "
                             "length 0; a model's data must hold at least one entry")
        for axis, (extent, length) in enumerate(zip(axes, a.shape)):
            if extent in extents and extents[extent][0] != length:
                value, source = extents[extent]
                raise ValueError(f"{name}: axis {axis} ({extent}) has length {length}, but "
                                 f"{extent} = {value} from {source}")
            extents.setdefault(extent, (length, name))
        if isinstance(data[name], np.ndarray) and np.shares_memory(a, data[name]):
            a = a.copy()  # the model's own copy: freezing it must not freeze the caller's
        a.setflags(write=False)
        out[name] = a
    return out


def _resolve(header, model_name: str | None) -> tuple[Path, str]:
    """The header's absolute path and the PYSHARP_MODEL it declares (or ``model_name``)."""
    header = Path(header).expanduser().resolve()
    if not header.is_file():
        raise FileNotFoundError(f"no model header at {header}")
    names = model_names(header)
    if model_name is None:
        if len(names) != 1:
            found = ", ".join(names) if names else "none"
            raise ValueError(f"{header.name} must declare exactly one PYSHARP_MODEL(Name, "
                             f"...) (found: {found}); pass model_name= to choose")
        model_name = names[0]
    elif model_name not in names:
        raise ValueError(f"{header.name} declares no PYSHARP_MODEL({model_name}, ...); "
                         f"it declares {', '.join(names) or 'none'}")
    return header, model_name


class _Compiled:
    """What both kinds of loaded model share: the header, its compiled modules (one per
    dtype, compiled at first use) and the validated fields they are built from."""

    #: the module's KIND this class holds, and the spec name it rebuilds from
    _kind: str
    _spec_name: str
    _cores: dict

    def _load(self, header, fields: dict[str, Any], dtype, model_name: str | None,
              include_dirs, modules: dict | None = None) -> None:
        self._pinned = dict(modules or {})
        if self._pinned and model_name is not None:  # the header as it was: not read again
            self.header, self.model_name = Path(header).expanduser().resolve(), model_name
        else:
            self.header, self.model_name = _resolve(header, model_name)
        self.include_dirs = tuple(Path(d).expanduser().resolve() for d in include_dirs)
        self.dtype = _DTYPES[_dtype_name(dtype)]
        self._modules: dict[np.dtype, Any] = {}
        module = self._module(self.dtype)
        if module.KIND != self._kind:
            raise TypeError(f"{self.header.name}: {self.model_name} is a {module.KIND} model, "
                            f"not a {self._kind} one; pysharp.models.load_model picks the class "
                            "that fits")
        self.fields = _validated(list(module.FIELDS), dict(fields), self.header, self.dtype)
        self._dim = int(self._compiled_core(self.dtype).dim)

    @property
    def dim(self) -> int:
        return self._dim

    def _module(self, dtype: np.dtype):
        dtype = np.dtype(dtype)
        if dtype not in self._modules:
            if dtype.name in self._pinned:
                self._modules[dtype] = self._pinned_module(dtype)
            else:
                self._modules[dtype] = compile_model(self.header, self.model_name, dtype.name,
                                                     self.include_dirs)
        return self._modules[dtype]

    def compiled_modules(self) -> dict[str, dict[str, str]]:
        """The compiled modules this model runs, by dtype name (float64, the engine's,
        always among them): ``{"module": name, "file": path}``.

        The name identifies the model's source: the compile cache names a module by a
        hash over the header, every file the compiler read for it, the compiler and its
        flags. A model built with ``modules=`` these loads the very same modules from
        ``file`` (what a sweep's workers do), whatever the header says by then.
        """
        self._module(np.float64)
        return {dtype.name: {"module": module.__name__, "file": str(module.__file__)}
                for dtype, module in sorted(self._modules.items(), key=lambda kv: kv[0].name)}

    def _pinned_module(self, dtype: np.dtype):
        """The module ``modules=`` named for ``dtype``: loaded from its file, or where that
        file is absent (another machine's cache) compiled from the header, which must
        then give the same module."""
        name, file = self._pinned[dtype.name]["module"], Path(self._pinned[dtype.name]["file"])
        if file.is_file():
            return _compiler._import(name, file)
        module = compile_model(self.header, self.model_name, dtype.name, self.include_dirs)
        if module.__name__ != name:
            raise ModelCompileError(
                f"{self.header.name}: this run needs {name}, the module compiled from the "
                f"header as it was when the run started; it is not at {file}, and the header "
                f"as it is now compiles to another ({module.__name__}): the header or a file "
                "it includes has changed since")
        return module

    def _declaration(self) -> tuple[Path, str, tuple[Path, ...]]:
        return self.header, self.model_name, self.include_dirs

    @property
    def _kernel_module(self):
        """The module whose module-level functions (SLQ) take this model's float64 core."""
        return self._module(np.float64)

    def _compiled_core(self, dtype) -> Any:
        dtype = np.dtype(dtype)
        if dtype not in self._cores:
            data = {k: (np.ascontiguousarray(v, dtype=dtype)
                        if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
                    for k, v in self.fields.items()}
            try:
                self._cores[dtype] = self._module(dtype).Model(data)
            except ValueError as exc:
                raise ValueError(f"{self.header.name}: {exc}") from None
        return self._cores[dtype]

    def spec(self) -> dict:
        return {"model": self._spec_name, "header": str(self.header),
                "model_name": self.model_name, "dtype": self.dtype.name,
                "include_dirs": [str(d) for d in self.include_dirs], "fields": dict(self.fields)}

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={v.shape}" if isinstance(v, np.ndarray) else f"{k}={v!r}"
                           for k, v in self.fields.items())
        return (f"{type(self).__name__}({self.header.name}: {self.model_name}"
                f"<{self.dtype.name}>, {shapes}, dim={self.dim})")


class LoadedModel(_Compiled, ScaleInvariantModel):
    """A scale-invariant model compiled at run time from a C++ header.

    Built by :func:`load_model`; the kernels, the trajectory engine, Lanczos
    and SLQ run in the model's own compiled library, compiled with the core's
    flags, exactly as for a built-in model (``backend="auto"`` or ``"cpp"``).
    ``backend="cupy"`` runs the kernels, the engine and Lanczos on a GPU: the header
    compiled by NVRTC at first use, the struct the module holds copied to the device.

    Attributes
    ----------
    header : Path
        The model's header.
    model_name : str
        The struct declared by its ``PYSHARP_MODEL``.
    dtype : numpy.dtype
        The precision compiled first; the other one is compiled at its first use.
    fields : dict
        The bound data: float arrays (float64 copies, read-only), int arrays
        (int32) and scalars, by field name.
    """

    _kind = "scale_invariant"
    _spec_name = "loaded"
    _backends = ("cpp", "cupy")
    _backends_why = ("a loaded model runs in its own compiled library, or on a GPU through "
                     "CuPy (its header compiled by NVRTC)")
    _undefined_reason = "the model's loss_grad reports the loss undefined there"

    def __init__(self, header, *, fields: dict[str, Any], dtype="float64",
                 model_name: str | None = None, include_dirs=(),
                 modules: dict | None = None) -> None:
        super().__init__()
        self._load(header, fields, dtype, model_name, include_dirs, modules)

    @property
    def group_bounds(self) -> np.ndarray:
        """The offsets 0 = b_0 < ... < b_G = dim of the parameter groups the header
        declares (``n_groups()``, and ``group_begin(k)`` for blocks of unequal sizes):
        group k is ``w[b_k:b_(k+1)]``, recorded as ``Trajectory.group_norm2[..., k]``;
        ``[0, dim]`` for a header that declares none."""
        return np.asarray(self._compiled_core(self.dtype).group_bounds, dtype=np.int64)

    def _make_core(self, suffix, module):
        """The model's struct bound through its own library's table (``module``, the shared
        core, has no class of its own for it), or on the CuPy backend (a ``module`` with
        ``loaded``) its device core, built from that struct."""
        real = np.float64 if suffix == "_f64" else np.float32
        if hasattr(module, "loaded"):
            return module.loaded(self, real)
        return self._compiled_core(real)


class LoadedSquareLossModel(_Compiled, SquareLossModel):
    """A square-loss model compiled at run time from a C++ header: SGD and the
    linear-stability tools on the user's own f(x; w).

    Built by :func:`load_model` when the header's struct has the square-loss members
    (``n_samples``, ``input_dim``, ``sample``, ``jacobian``; data fields ``X`` (n, d)
    and ``y`` (n,); see ``pysharp/models/square_loss.hpp``). Everything a
    :class:`SquareLossModel` does runs in the model's own library: the kernels,
    per-sample Jacobians, ``run_sgd``, the stability analysis, spectra, sweeps with
    ``method="sgd"``.

    Attributes
    ----------
    header, model_name, dtype, fields
        As for :class:`LoadedModel`.
    X : ndarray
        The bound training inputs (the ``X`` field), n samples by d inputs.
    y : ndarray
        The bound targets (the ``y`` field), one per sample.

    Notes
    -----
    The model declares no first layer, so :func:`pysharp.stability.input_smoothness`
    gives the moments without the first-layer bound (``grad_x_norm``, ``bound`` and
    ``holds`` are None).
    """

    _kind = "square_loss"
    _spec_name = "loaded_square_loss"
    has_first_layer = False

    def __init__(self, header, *, fields: dict[str, Any], dtype="float64",
                 model_name: str | None = None, include_dirs=(),
                 modules: dict | None = None) -> None:
        self._cores = {}
        self._load(header, fields, dtype, model_name, include_dirs, modules)
        declared = {f["name"]: list(f["extents"]) for f in self._module(self.dtype).FIELDS}
        X, y = declared["X"], declared["y"]
        if len(X) != 2 or y != X[:1]:
            raise ValueError(f"{self.header.name}: a square-loss model declares "
                             "PYSHARP_ARRAY(X, n, d) and PYSHARP_ARRAY(y, n); it declares "
                             f"X over ({', '.join(X)}) and y over ({', '.join(y)})")
        self.X, self.y = self.fields["X"], self.fields["y"]

    def _core(self, dtype) -> Any:
        return self._compiled_core(dtype)

    def _make_core(self, suffix):  # pragma: no cover - _core is overridden
        raise NotImplementedError

    def with_data(self, X, y=None) -> LoadedSquareLossModel:
        X = np.asarray(X)
        fields = dict(self.fields, X=X, y=np.zeros(X.shape[:1]) if y is None else y)
        return LoadedSquareLossModel(self.header, fields=fields, dtype=self.dtype,
                                     model_name=self.model_name, include_dirs=self.include_dirs)

    def first_layer(self, w):
        raise ValueError(f"{self.model_name} declares no first layer (a loaded model's "
                         "parameters have no layout pysharp knows)")


def load_model(header, *, dtype="float64", model_name: str | None = None, include_dirs=(),
               **data) -> LoadedModel:
    """Compile (once, then cached) and load a model written as one C++ header.

    The header defines a struct template with ``dim()``, ``work_size()`` and a
    templated ``loss_grad`` and declares its data with ``PYSHARP_MODEL`` (see
    ``pysharp/model.hpp`` under :func:`pysharp.include_dir` and the "Your own
    model" tutorial). The first call compiles it with the compiler and flags of
    pysharp's core (about 20 s on two cores); later calls, in any process of the
    same user, load the cached module in tens of milliseconds.

    Parameters
    ----------
    header : str or Path
        The model's header.
    dtype : {"float64", "float32"}
        Precision to compile now; the other is compiled when first used.
    model_name : str, optional
        Which ``PYSHARP_MODEL`` to load when the header declares several.
    include_dirs : sequence of paths
        Extra include folders for the header's own ``#include "..."``.
    **data
        One keyword per declared field: arrays (their shapes fill the declared
        extents) and scalars.

    Returns
    -------
    LoadedModel or LoadedSquareLossModel
        A :class:`ScaleInvariantModel` (every kernel, run method, sharpness,
        spectra, flow and sweep takes it), or, for a header with the square-loss
        members (``jacobian``, ``sample``), a :class:`SquareLossModel` that SGD
        and the linear-stability tools take.

    Raises
    ------
    ModelCompileError
        The compiler's diagnostics (pointing at the header), or no compiler.
    ValueError
        Data missing, unknown, of the wrong rank or dtype, with a non-finite entry
        (the first one's index named) or with inconsistent extents, naming the field.

    Warns
    -----
    UserWarning
        For float32 data of a float64 model (``dtype``): the model would compute with
        data rounded to float32. Pass float64 data, ``dtype="float32"``, or data you
        converted yourself.

    Examples
    --------
    >>> model = ps.models.load_model("phase_retrieval.hpp", X=X, y=y, c=1.0)  # doctest: +SKIP
    >>> model.loss_and_grad(model.random_point(seed=0))                      # doctest: +SKIP
    """
    header, model_name = _resolve(header, model_name)
    module = compile_model(header, model_name, _dtype_name(dtype),
                           tuple(Path(d).expanduser().resolve() for d in include_dirs))
    cls = LoadedSquareLossModel if module.KIND == "square_loss" else LoadedModel
    return cls(header, fields=data, dtype=dtype, model_name=model_name,
               include_dirs=include_dirs)


def load_model_files(header, data=None, params: dict | None = None, *, base=None,
                     source: str = "--param", **options) -> LoadedModel:
    """A loaded model described by files, for the command line and sweep configs.

    Parameters
    ----------
    header : str or Path
        The model's header; relative to ``base`` when relative.
    data : str or Path, optional
        An ``.npz`` file (``numpy.savez``) of the model's arrays (and 0-d scalars),
        relative to ``base``.
    params : dict, optional
        Scalar fields, as numbers or text (``--param c=1.5``).
    base : str or Path, optional
        Folder that relative paths are taken from (a config's own folder); default
        the working directory.
    source : str
        How a bad parameter is named in errors (``--param`` or ``model``).
    **options
        ``dtype``, ``model_name``, ``include_dirs`` of :func:`load_model`.
    """
    base = Path(base) if base is not None else Path.cwd()
    fields = fields_from_files(data, params, base=base, source=source)
    return load_model(base / Path(header).expanduser(), **options, **fields)


def fields_from_files(data=None, params: dict | None = None, *, base: Path,
                      source: str = "--param") -> dict[str, Any]:
    """The arrays of an ``.npz`` file (relative to ``base``) and the numbers of ``params``
    (text is read as an int, else a float), by name: a model's data given as files."""
    fields: dict[str, Any] = {}
    if data is not None:
        path = base / Path(data).expanduser()
        try:
            with np.load(path, allow_pickle=False) as npz:
                fields.update({k: npz[k] for k in npz.files})
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read the model data {path}: {exc}") from None
    for key, value in (params or {}).items():
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"{source} {key} must be a number, got {value!r}") from None
        fields[key] = value
    return fields


def _from_spec(header, *, fields: dict[str, Any], **options) -> LoadedModel | LoadedSquareLossModel:
    """A spec's ``{"name": "loaded", "header": ..., "fields": ...}``: either kind of model."""
    return load_model(header, **options, **fields)


register(ModelEntry("loaded", LoadedModel, _from_spec))
register(ModelEntry("loaded_square_loss", LoadedSquareLossModel, _from_spec,
                    plot_metrics=SGD_PLOTS))

__all__ = ["LoadedModel", "LoadedSquareLossModel", "load_model", "load_model_files",
           "ModelCompileError"]
