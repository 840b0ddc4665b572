"""Sphinx configuration of the pysharp documentation.

Build: ``pip install ".[docs]"`` then ``sphinx-build -W -b html docs docs/_build``.
autodoc imports pysharp, so the compiled module must be importable (installed, or
the source tree on PYTHONPATH with ``pysharp/_core*.so`` built).
"""

from __future__ import annotations

import pysharp

project = "pysharp"
author = "the pysharp authors"
copyright = "the pysharp authors"  # noqa: A001 - Sphinx's name
release = pysharp.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

autosummary_generate = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the numpydoc Parameters sections state types and shapes
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

exclude_patterns = ["_build", ".gitignore"]
html_theme = "furo"
html_title = f"pysharp {release}"
napoleon_use_param = False  # types as text: "shape (n, d)" must not become references to n, d
napoleon_use_ivar = True


def _escape_bars(app, what, name, obj, options, lines):
    """Docstrings write absolute values and norms as |x|, which reST reads as a
    substitution reference; escape the bars (line blocks and tables excepted)."""
    for i, line in enumerate(lines):
        if "|" in line and not line.lstrip().startswith(("|", "+")):
            lines[i] = line.replace("|", r"\|")


def setup(app):
    app.connect("autodoc-process-docstring", _escape_bars)
