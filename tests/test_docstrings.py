"""The Examples sections of the public docstrings run, and print what they say.

Each module listed has examples (a module that loses them fails here rather than going
quietly untested); the numbers printed are rounded so that any x86-64 build agrees.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["pysharp.dynamics", "pysharp.sgd", "pysharp.sharpness", "pysharp.theory",
           "pysharp.sweeps._sweep"]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run_as_written(name):
    if name.startswith("pysharp.sweeps"):
        pytest.importorskip("xarray")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False, report=True)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
