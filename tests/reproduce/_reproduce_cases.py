"""What the tests of ``pysharp reproduce`` share: the datasets' files written in their
published formats at a few images each (test_datasets.py, test_cifar_sharpness.py,
test_fashion_stability.py), and the quick runs of every experiment with a description of
each figure they saved, run once per session (test_figures.py, test_reproduce.py).

Test modules import from here (``from _reproduce_cases import write_cifar``): pytest puts
this folder on ``sys.path`` when it imports a test module from it, so no test module imports
another. matplotlib is imported only by the figure helpers.
"""

from __future__ import annotations

import functools
import gzip
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np

from pysharp import reproduce


# -- CIFAR-10's python batches -----------------------------------------------------------
def write_cifar_batch(path, images, labels, protocol=2):
    """A CIFAR-10 batch file: images (N, 3, 32, 32) uint8 as b'data' (N, 3072)."""
    batch = {b"batch_label": b"testing batch", b"labels": [int(c) for c in labels],
             b"data": np.asarray(images, dtype=np.uint8).reshape(len(images), 3072),
             b"filenames": [b"img%d.png" % i for i in range(len(images))]}
    with open(path, "wb") as fh:
        pickle.dump(batch, fh, protocol=protocol)


def write_cifar(folder, per_batch=(12, 12, 0, 0, 0), n_test=7, seed=0, protocol=2):
    """CIFAR-10's batch files in ``folder/cifar-10-batches-py`` with ``per_batch`` images in
    data_batch_1..5 (0: the file is left out), labels cycling over the classes; returns the
    images and labels written, in file order."""
    rng = np.random.default_rng(seed)
    folder = folder / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written, start = [], 0
    for i, n in enumerate(per_batch, start=1):
        if not n:
            continue
        X = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        y = (np.arange(start, start + n) * 3) % 10
        write_cifar_batch(folder / f"data_batch_{i}", X, y, protocol)
        written.append((X, y))
        start += n
    X = rng.integers(0, 256, (n_test, 3, 32, 32), dtype=np.uint8)
    y = np.arange(n_test) % 10
    write_cifar_batch(folder / "test_batch", X, y, protocol)
    return np.concatenate([x for x, _ in written]), np.concatenate([y for _, y in written]), X, y


# -- FashionMNIST's IDX files ------------------------------------------------------------
def idx(magic, shape, values, compress=True):
    """An IDX file's bytes: magic, big-endian dimensions, uint8 values (gzipped)."""
    raw = magic.to_bytes(4, "big") + b"".join(int(n).to_bytes(4, "big") for n in shape) + \
        np.asarray(values, dtype=np.uint8).tobytes()
    return gzip.compress(raw) if compress else raw


def write_fashion(folder, n_train=9, n_test=4, seed=0, compress=True):
    """FashionMNIST's four IDX files in ``folder`` with random images and labels; returns
    {"train": (X, y), "t10k": (X, y)}."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for part, n in (("train", n_train), ("t10k", n_test)):
        X = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        suffix = ".gz" if compress else ""
        (folder / f"{part}-images-idx3-ubyte{suffix}").write_bytes(
            idx(0x803, (n, 28, 28), X, compress))
        (folder / f"{part}-labels-idx1-ubyte{suffix}").write_bytes(idx(0x801, (n,), y, compress))
        arrays[part] = (X, y)
    return arrays


# -- the quick runs and their figures ----------------------------------------------------
def describe(fig) -> dict:
    """What a reviewer reads on a figure: its title and each panel's labels."""
    axes = []
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        axes.append({"title": ax.get_title(), "xlabel": ax.get_xlabel(),
                     "ylabel": ax.get_ylabel(),
                     "legend": [t.get_text() for t in ax.get_legend().get_texts()]
                     if ax.get_legend() else None})
    colorbars = [ax.get_ylabel() or ax.get_xlabel() for ax in fig.axes
                 if ax.get_label() == "<colorbar>"]
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return {"suptitle": suptitle, "axes": axes, "colorbars": colorbars}


class Capture:
    """Record ``describe(fig)`` of every figure saved while active, by file name."""

    def __init__(self):
        self.figures: dict[str, dict] = {}

    def __enter__(self):
        from matplotlib.figure import Figure

        self._orig = Figure.savefig
        capture = self

        def savefig(fig, fname, *args, **kwargs):
            capture.figures[Path(str(fname)).name] = describe(fig)
            return capture._orig(fig, fname, *args, **kwargs)

        Figure.savefig = savefig
        return self

    def __exit__(self, *exc):
        from matplotlib.figure import Figure

        Figure.savefig = self._orig


@functools.lru_cache(maxsize=1)
def quick_all():
    """(folder, summaries, figure descriptions) of ``reproduce.run_all(quick=True)``, once."""
    import matplotlib

    matplotlib.use("Agg")
    folder = Path(tempfile.mkdtemp(prefix="pysharp-figures-"))
    with warnings.catch_warnings():
        # constrained layout: no "Tight layout not applied" or other layout warnings
        warnings.filterwarnings("error", message=".*[Ll]ayout.*")
        with Capture() as cap:
            results = reproduce.run_all(folder, quick=True)
    return folder, results, cap.figures
