"""The error every backend raises when it cannot run a call."""

from __future__ import annotations


class BackendUnavailable(ImportError):
    """The requested backend cannot run here; the message says why."""
