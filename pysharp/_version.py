"""pysharp's version, as the build recorded it: the installed distribution's metadata, else
the version compiled into the core (a source tree on PYTHONPATH beside a built _core)."""

from importlib.metadata import PackageNotFoundError, version


def _version() -> str:
    try:
        return version("pysharp")
    except PackageNotFoundError:
        try:
            from ._core import __version__ as built  # lazy: only without installed metadata
        except ImportError:
            return "0+unknown"
        return built


__version__ = _version()
