"""TOML sweep configs for ``pysharp sweep``: parsed and validated before any work.

Example (see ``examples/`` for more)::

    [model]
    name = "bn_linear_regression"   # then the factory's parameters: d, n, seed, noise
    d = 40

    [grid]
    lr = { geomspace = [0.05, 2.0, 32] }   # or a list, or a number
    wd = { geomspace = [1e-5, 1e-3, 32] }
    seeds = { range = 4 }                  # 0, 1, 2, 3 (a list: [4] is seed 4; no number)
    init_norm = 1.0

    [run]
    steps = 10000
    sharpness_every = 500

    [output]
    store = "bn-linreg.zarr"

Other methods: ``[run] method = "pgd" | "scalar_rmsprop" | "sgd"`` (default
``"gd_wd"``). For ``"sgd"`` the grid takes ``batch`` (batch sizes) and ``wd``
may be left out (0)::

    [model]
    name = "linear_regression"
    d = 10
    n = 20

    [grid]
    lr = { geomspace = [0.01, 1.0, 24] }
    batch = [1, 2, 4, 8, 20]

    [run]
    method = "sgd"
    steps = 5000
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from .._engine.methods import ALL_METHODS
from ..models import from_jax_file, load_model_files
from ..models._registry import REGISTRY
from . import _spec
from ._compute import METHOD_DIMS
from ._sweep import seeds_axis

_SECTIONS = {
    "model": None,  # checked against the model's factory
    "grid": {"lr", "wd", "seeds", "init_norm", "batch"},
    "run": {"method", "steps", "record_every", "sharpness_every", "jitter", "eos_tol", "backend",
            "chunk_size", "replacement", "rms_beta", "rms_eps"},
    "output": {"store"},
}
_REQUIRED = {"model": {"name"}, "grid": {"lr"}, "run": {"steps"}}


#: ``[run]`` keys that take whole numbers (an integral float such as 1e5 is accepted).
_INTEGER_RUN_KEYS = ("steps", "record_every", "sharpness_every", "chunk_size")


def whole_number(value: Any, name: str) -> int:
    """``value`` as an int: an int, an integral float (``1e5``) or such a number's text.

    Raises ValueError naming ``name`` for anything else (``1.5``, ``"forty"``, ``true``).
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name} must be a whole number, got {text!r}") from None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, (float, np.floating)):
        if not (np.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        if abs(value) >= 2**63:
            raise ValueError(f"{name} is too large: {value!r}")
    return int(value)


def model_parameters(name: str, params: dict, source: str = "model") -> dict:
    """A registered model's factory parameters, each converted to the type its factory takes.

    Values may be text (from ``--param KEY=VALUE``) or TOML values. Whole-number
    parameters accept integral floats (``d = 4e1``); ``int | None`` parameters also
    ``none``. Unknown models and parameters are left to ``_spec.normalise``.

    Raises
    ------
    ValueError
        Naming the parameter, its value and the type expected.
    """
    import inspect

    if name not in REGISTRY:
        return dict(params)
    signature = inspect.signature(REGISTRY[name].factory).parameters
    out = {}
    for key, value in params.items():
        param = signature.get(key)
        note = param.annotation if param is not None else ""
        kind = note if isinstance(note, str) else getattr(note, "__name__", str(note))
        types = {t.strip() for t in kind.split("|")}
        where = f"--param {key}" if source == "--param" else f"{source}.{key}"
        if param is None or not types & {"int", "float", "bool", "str"}:
            out[key] = value
        elif "None" in types and isinstance(value, str) and value.lower() in ("none", "null"):
            out[key] = None
        elif "int" in types:
            try:
                out[key] = whole_number(value, where)
            except ValueError:
                raise ValueError(f"{where} must be a whole number (default "
                                 f"{param.default!r}), got {value!r}") from None
        elif "float" in types:
            try:
                if isinstance(value, (bool, np.bool_)):
                    raise ValueError
                out[key] = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{where} must be a number (default {param.default!r}), "
                                 f"got {value!r}") from None
        elif "bool" in types:
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be true or false, got {value!r}")
            out[key] = value
        else:  # str
            if not isinstance(value, str):
                raise ValueError(f"{where} must be a string, got {value!r}")
            out[key] = value
    return out


def grid_values(value: Any, key: str) -> np.ndarray:
    """A grid axis from a number, a list, or {linspace|geomspace = [a, b, n]} /
    {range = n | [a, b]}."""
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError(f"{key}: give one of linspace, geomspace, range; got {sorted(value)}")
        (kind, args), = value.items()
        if kind in ("linspace", "geomspace"):
            if not (isinstance(args, list) and len(args) == 3 and isinstance(args[2], int)):
                raise ValueError(f"{key}.{kind} must be [start, stop, count]")
            if kind == "geomspace" and (args[0] <= 0 or args[1] <= 0):
                raise ValueError(f"{key}.geomspace needs positive start and stop")
            return getattr(np, kind)(args[0], args[1], args[2])
        if kind == "range":
            args = args if isinstance(args, list) else [args]
            if not (1 <= len(args) <= 3 and all(isinstance(a, int) for a in args)):
                raise ValueError(f"{key}.range must be n or [start, stop(, step)] of integers")
            return np.arange(*args)
        raise ValueError(f"{key}: unknown grid form {kind!r}; use linspace, geomspace or range")
    if isinstance(value, bool) or not isinstance(value, (int, float, list)):
        raise ValueError(f"{key} must be a number, a list of numbers or a range table")
    if isinstance(value, list) and not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                           for v in value):
        raise ValueError(f"{key} must be a list of numbers")
    return np.asarray(value)


def parse(config: dict, source: str = "config", base: Path | None = None) -> dict:
    """Validated keyword arguments of ``pysharp.sweep`` from a config's tables.

    A ``[model]`` table names a registered model (``name``), a model header
    (``header``, with ``data``: an ``.npz`` of its arrays, and its scalar fields as
    keys) or a loss written in JAX (``python = "file.py:loss"``, ``dim``, ``data`` and
    scalars likewise); paths are relative to ``base``, the config's folder.

    Raises ValueError naming the offending key (``section.key``).
    """
    if not isinstance(config, dict):
        raise ValueError(f"{source}: expected tables {sorted(_SECTIONS)}")
    for section in config:
        if section not in _SECTIONS:
            raise ValueError(f"{source}: unknown section [{section}]; "
                             f"expected {sorted(_SECTIONS)}")
        if not isinstance(config[section], dict):
            raise ValueError(f"{source}: [{section}] must be a table")
    for section, keys in _REQUIRED.items():
        for key in keys:
            if section == "model" and {"header", "python"} & set(config.get("model", {})):
                continue  # a model header or a JAX loss instead of a registered name
            if key not in config.get(section, {}):
                raise ValueError(f"{source}: missing {section}.{key}")
    for section, allowed in _SECTIONS.items():
        for key in config.get(section, {}):
            if allowed is not None and key not in allowed:
                raise ValueError(f"{source}: unknown key {section}.{key}; "
                                 f"[{section}] takes {sorted(allowed)}")
    method = config.get("run", {}).get("method", "gd_wd")
    if not isinstance(method, str) or method not in METHOD_DIMS:
        raise ValueError(f"{source}: run.method must be one of {sorted(METHOD_DIMS)}, "
                         f"got {method!r}")
    for axis in ALL_METHODS[method].required:
        key = "lr" if axis == "eta" else axis  # the lr axis is the step size on the sphere
        if key not in config["grid"]:
            raise ValueError(f"{source}: missing grid.{key} (method {method!r})")
    model = dict(config["model"])
    if "python" in model:
        if "name" in model or "header" in model:
            raise ValueError(f"{source}: [model] takes one of name, header, python")
        if "dim" not in model:
            raise ValueError(f"{source}: missing model.dim (the JAX loss's number of "
                             "parameters)")
        dim = whole_number(model.pop("dim"), "model.dim")
        options = {k: model.pop(k) for k in ("dtype", "groups") if k in model}
        model = from_jax_file(model.pop("python"), dim, model.pop("data", None), model,
                              base=base, source="model", **options)
    elif "header" in model:
        if "name" in model:
            raise ValueError(f"{source}: [model] takes a name or a header, not both")
        options = {k: model.pop(k) for k in ("dtype", "model_name") if k in model}
        model = load_model_files(model.pop("header"), model.pop("data", None), model,
                                 base=base, source="model", **options)
    elif isinstance(model.get("name"), str):
        rest = {k: v for k, v in model.items() if k != "name"}
        model = {"name": model["name"], **model_parameters(model["name"], rest, "model")}
    kwargs: dict[str, Any] = {"model": _spec.normalise(model)}
    for key, value in config["grid"].items():
        kwargs[key] = grid_values(value, f"grid.{key}")
        if key == "seeds":
            try:
                seeds_axis(kwargs[key], "grid.seeds", table=True)
            except TypeError as exc:  # a config's mistakes are ValueErrors
                raise ValueError(str(exc)) from None
    for key, value in config.get("run", {}).items():
        if key in ("backend", "method"):
            if not isinstance(value, str):
                raise ValueError(f"run.{key} must be a string")
        elif key == "replacement":
            if not isinstance(value, bool):
                raise ValueError("run.replacement must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"run.{key} must be a number")
        elif key in _INTEGER_RUN_KEYS:
            value = whole_number(value, f"run.{key}")
        kwargs[key] = value
    store = config.get("output", {}).get("store")
    if store is not None:
        if not isinstance(store, str) or not store:
            raise ValueError("output.store must be a path string")
        kwargs["store"] = store
    return kwargs


def load_config(path: str | Path) -> dict:
    """Read and validate a sweep config file; the keyword arguments of ``pysharp.sweep``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no config file at {path}")
    try:
        with path.open("rb") as f:
            config = tomllib.load(f)
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    return parse(config, str(path), path.resolve().parent)
