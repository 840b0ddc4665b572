"""The model registry: everything the layers above the kernels need to know about a model.

Sweeps, the command line, the dynamics and the reproduce layer ask the registry
instead of testing ``isinstance``; a new model registers one :class:`ModelEntry`
next to its class (see docs/tutorials/adding_a_model.rst) and is then sweepable by name,
rebuildable from its spec, and summarised with its own metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Summary:
    """A model-specific per-trajectory number computed from the final iterates of a sweep.

    Attributes
    ----------
    doc : str
        One line for the stored variable's ``description`` attribute.
    compute : callable
        ``compute(model, w)`` with ``w`` (B, D) the final iterates (finite rows only
        are meaningful) -> ndarray (B,). Must work row by row: a row's value may not
        depend on the rest of the chunk.
    applies : callable
        ``applies(model) -> bool``: whether this model instance has the summary (a
        held-out loss needs held-out data). Decided before any work.
    """

    doc: str
    compute: Callable[[Any, np.ndarray], np.ndarray]
    applies: Callable[[Any], bool] = lambda model: True


@dataclass(frozen=True)
class ModelEntry:
    """What pysharp knows about one model class.

    Attributes
    ----------
    name : str
        The spec name: ``model.spec()["model"]``, the name ``ps.sweep`` accepts.
    cls : type
        The model class; ``cls(**spec_without_name)`` rebuilds an instance.
    factory : callable
        Builds a synthetic instance from keyword parameters (``ps.sweep("name", ...)``
        and ``{"name": ..., **params}`` specs call it).
    summaries : dict
        name -> :class:`Summary`, the model's own sweep summaries.
    plot_metrics : tuple of str
        The sweep variables a first plot of this model should show.
    """

    name: str
    cls: type
    factory: Callable[..., Any]
    summaries: dict[str, Summary] = field(default_factory=dict)
    plot_metrics: tuple[str, ...] = ("eos_entry_step", "final_sharpness", "final_loss")


#: name -> entry, in registration order.
REGISTRY: dict[str, ModelEntry] = {}


def register(entry: ModelEntry) -> ModelEntry:
    """Add ``entry`` to the registry (a name is registered once); returns it."""
    if entry.name in REGISTRY and REGISTRY[entry.name].cls is not entry.cls:
        raise ValueError(f"model name {entry.name!r} is already registered "
                         f"for {REGISTRY[entry.name].cls.__name__}")
    REGISTRY[entry.name] = entry
    return entry


def entry_of(model: Any) -> ModelEntry:
    """The registry entry of a model instance, class or name.

    Raises
    ------
    ValueError
        For a name or class nobody registered, listing the registered names.
    """
    if isinstance(model, str):
        if model in REGISTRY:
            return REGISTRY[model]
    else:
        cls = model if isinstance(model, type) else type(model)
        for entry in REGISTRY.values():
            if issubclass(cls, entry.cls):
                return entry
        model = cls.__name__
    raise ValueError(f"unknown model {model!r}; registered: {sorted(REGISTRY)}")
