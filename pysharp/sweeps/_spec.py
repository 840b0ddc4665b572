"""Model specs: plain data from which a worker rebuilds a model.

A sweep ships a spec, not a model, to its workers: the compiled kernel objects
a model holds cannot be pickled, and a name plus a few numbers is all a
synthetic model needs. Two forms are accepted:

- ``{"name": "bn_linear_regression", "d": 40, "n": 20, "seed": 0}``: a
  registered synthetic model and the arguments of its factory;
- a model instance (scale-invariant, or a square-loss model for SGD), whose
  ``spec()`` (its data arrays included) is shipped instead; the stored
  metadata then keeps only the arrays' SHA-256.

A model compiled at run time (``load_model``, ``from_jax``; a spec naming a
header becomes one) is pinned: its spec holds ``modules``, the compiled
modules it runs (name and file, see ``LoadedModel.compiled_modules``), so
every worker runs the modules the sweep started with even if the header is
edited meanwhile, and the stored identity keeps their names, the compile
cache's key over the header and every file it includes (:func:`source`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from functools import lru_cache
from typing import Any

import numpy as np

from ..models import ScaleInvariantModel, SquareLossModel
from ..models._registry import REGISTRY, entry_of


def factory_parameters(name: str) -> list[str]:
    """The keyword parameters a registered model's factory accepts."""
    return [p for p in inspect.signature(REGISTRY[name].factory).parameters if p != "cls"]


def _compiled(name: str) -> bool:
    """Whether the registered model ``name`` is compiled at run time (a loaded model)."""
    return hasattr(REGISTRY[name].cls, "compiled_modules")


def normalise(model: Any) -> dict:
    """A validated spec dict from a name, a spec dict or a model instance.

    Raises ValueError naming an unknown model or parameter, before any work.
    """
    if isinstance(model, (ScaleInvariantModel, SquareLossModel)):
        spec = dict(model.spec())
        entry_of(model)  # an unregistered model class cannot be rebuilt by a worker
        out = {"name": spec.pop("model"), "data": spec}
        if getattr(model, "truth", None) is not None:  # a synthetic model's ground truth
            out["truth"] = model.truth
        if hasattr(model, "compiled_modules"):  # pinned: see the module's docstring
            out["modules"] = model.compiled_modules()
        return out
    if isinstance(model, str):
        model = {"name": model}
    if not isinstance(model, dict):
        raise TypeError("model must be a registered name, a spec dict {'name': ..., ...} "
                        f"or a pysharp model, got {type(model).__name__}")
    spec = dict(model)
    if isinstance(spec.get("data"), dict) and set(spec) <= {"name", "data", "truth", "modules"} \
            and spec.get("name") in REGISTRY:
        if "modules" in spec or not _compiled(spec["name"]):
            return spec  # already normalised from a model instance (a parsed config)
        return normalise(build(spec))
    name = spec.pop("name", None)
    if name not in REGISTRY:
        raise ValueError(f"model: unknown model {name!r}; choose one of {sorted(REGISTRY)}")
    allowed = factory_parameters(name)
    for key in spec:
        if key not in allowed:
            raise ValueError(f"model.{key}: unknown parameter of {name!r}; "
                             f"it takes {allowed}")
    if _compiled(name):  # built now, from the header as it is now, and pinned
        return normalise(REGISTRY[name].factory(**spec))
    try:
        json.dumps(spec)
    except TypeError:  # data arrays (a loaded model's fields): ship the instance's spec
        return normalise(REGISTRY[name].factory(**spec))
    spec = {"name": name, **spec}
    cached(spec)  # bad values fail here, before any chunk runs
    return spec


def build(spec: dict) -> ScaleInvariantModel | SquareLossModel:
    """The model a spec describes (a fresh instance)."""
    if "data" in spec:
        pinned = {"modules": spec["modules"]} if "modules" in spec else {}
        model = REGISTRY[spec["name"]].cls(**spec["data"], **pinned)
        if "truth" in spec:
            model.truth = spec["truth"]
        return model
    params = {k: v for k, v in spec.items() if k != "name"}
    return REGISTRY[spec["name"]].factory(**params)


@lru_cache(maxsize=8)
def _cached(spec_json: str) -> ScaleInvariantModel | SquareLossModel:
    return build(json.loads(spec_json))


def cached(spec: dict) -> ScaleInvariantModel | SquareLossModel:
    """The model of ``spec``, built once per process and shared (do not mutate it).

    Data specs (from a model instance) are rebuilt each time.
    """
    if "data" in spec:
        return build(spec)
    return _cached(json.dumps(spec, sort_keys=True))


def describe(spec: dict) -> dict:
    """JSON-safe form of a spec for stored metadata: arrays become their SHA-256."""
    def safe(value):
        if isinstance(value, np.ndarray):
            digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
            return {"array_sha256": digest, "shape": list(value.shape), "dtype": str(value.dtype)}
        if isinstance(value, (tuple, list)):
            return [safe(v) for v in value]
        if isinstance(value, dict):
            return {k: safe(v) for k, v in value.items()}
        if isinstance(value, np.generic):
            return value.item()
        if callable(value):  # a loss written in JAX: its name and its code's digest
            code = getattr(value, "__code__", None)
            text = code.co_code + repr(code.co_consts).encode() if code else repr(value).encode()
            return {"function": f"{getattr(value, '__module__', '?')}."
                                f"{getattr(value, '__qualname__', repr(value))}",
                    "code_sha256": hashlib.sha256(text).hexdigest()}
        if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
            return safe(np.asarray(value))  # a JAX array
        return value
    out = safe({k: v for k, v in spec.items() if k != "modules"})
    if "modules" in spec:  # their names (the source's key), not where this machine keeps them
        out["modules"] = {dtype: m["module"] for dtype, m in spec["modules"].items()}
    json.dumps(out)  # raises early if something is still not plain data
    return out


def source(described: dict) -> str | None:
    """What the chunks of a sweep of the model ``described`` (a :func:`describe`'d spec,
    as stored in a sweep's identity) must have been computed by: its compiled modules'
    names, or None for a model that is not compiled at run time. Every chunk's marker
    records it (``SweepStore``)."""
    modules = described.get("modules")
    return None if modules is None else json.dumps(modules, sort_keys=True)
