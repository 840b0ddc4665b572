"""The papers' datasets, read from the files as their publishers distribute them.

Nothing is downloaded: ``pysharp reproduce ... --data DIR`` points at files the user fetched
(:func:`how_to_get` says which and where from). Files holding fewer images than the real sets
are read as they are; the experiments shrink their subsets to fit and say so.

- CIFAR-10 (python version): ``DIR/cifar-10-batches-py/`` or ``DIR`` itself holding
  ``data_batch_1`` ... ``data_batch_5`` and ``test_batch``, pickles of a dict with
  ``b"data"`` (N, 3072) uint8 (1024 red, 1024 green, 1024 blue values, each a 32 x 32 image
  row by row) and ``b"labels"`` (N ints 0-9). The pickles are read with an unpickler that
  accepts only dicts, lists, strings, numbers and NumPy arrays, so a file that would run
  code when unpickled is refused.
- FashionMNIST: ``DIR`` holding ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
  ``t10k-images-idx3-ubyte.gz``, ``t10k-labels-idx1-ubyte.gz`` (or the same names without
  ``.gz``), in the IDX format: big-endian int32 magic 0x00000803 then n, 28, 28 and the
  n x 28 x 28 uint8 pixels for images; magic 0x00000801 then n and n uint8 labels.
"""

from __future__ import annotations

import gzip
import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_FILES = {"train_images": "train-images-idx3-ubyte.gz",
                 "train_labels": "train-labels-idx1-ubyte.gz",
                 "test_images": "t10k-images-idx3-ubyte.gz",
                 "test_labels": "t10k-labels-idx1-ubyte.gz"}
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")


class DataNotFound(ValueError):
    """The dataset's files are not where they were looked for (the message says what to get)."""


@dataclass
class Split:
    """Images and labels of a dataset's training and test sets.

    Attributes
    ----------
    X_train, X_test : ndarray of uint8
        CIFAR-10: (n, 3, 32, 32), channels first; FashionMNIST: (n, 28, 28).
    y_train, y_test : ndarray of int64, shape (n,)
        Class labels 0-9.
    source : str
        The folder the files were read from.
    files : list of str
        The files read, in order.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    source: str
    files: list


def how_to_get(dataset: str) -> str:
    """What to download for ``dataset`` ("cifar10" or "fashion-mnist") and where to put it."""
    if dataset == "cifar10":
        return (f"CIFAR-10 is not downloaded by pysharp. Get the python version, "
                f"{CIFAR10_URL} (163 MB), unpack it (tar xzf cifar-10-python.tar.gz) into a "
                "folder DIR, so that DIR/cifar-10-batches-py/ holds data_batch_1 ... "
                "data_batch_5 and test_batch, and pass --data DIR")
    if dataset == "fashion-mnist":
        names = ", ".join(FASHION_FILES.values())
        return (f"FashionMNIST is not downloaded by pysharp. Get {names} from {FASHION_URL} "
                "(or github.com/zalandoresearch/fashion-mnist, data/fashion/) into a folder "
                "DIR, unchanged (gzip-compressed), and pass --data DIR")
    raise ValueError(f"unknown dataset {dataset!r}: 'cifar10' or 'fashion-mnist'")


# -- CIFAR-10 -----------------------------------------------------------------------------
class _Unpickler(pickle.Unpickler):
    """Only what CIFAR-10's batches hold: builtins' containers and NumPy arrays."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR-10 batch file")


def cifar10_dir(data_dir) -> Path:
    """The folder holding CIFAR-10's batch files: ``DIR/cifar-10-batches-py`` or ``DIR``.

    Raises
    ------
    DataNotFound
        Neither holds ``test_batch`` and ``data_batch_1``; the message says what to download.
    """
    root = Path(data_dir).expanduser()
    for folder in (root / "cifar-10-batches-py", root):
        if (folder / CIFAR10_TEST_FILE).is_file() and (folder / CIFAR10_TRAIN_FILES[0]).is_file():
            return folder
    raise DataNotFound(f"no CIFAR-10 batches (data_batch_1 and test_batch) in {root} or "
                       f"{root / 'cifar-10-batches-py'}. {how_to_get('cifar10')}")


def read_cifar10_batch(path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 batch file: images (N, 3, 32, 32) uint8 and labels (N,) int64.

    Raises
    ------
    ValueError
        The file is not a CIFAR-10 batch (not a pickle of the expected dict, wrong shape or
        dtype, labels outside 0-9, or objects a batch never holds).
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            batch = _Unpickler(io.BytesIO(fh.read()), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError,
            TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a CIFAR-10 batch file (python version): {exc}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path} is not a CIFAR-10 batch: expected a dict with b'data' and "
                         f"b'labels', got {type(batch).__name__}"
                         f"{' with keys ' + str(sorted(batch)) if isinstance(batch, dict) else ''}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: b'data' must be (N, 3072) uint8, got {data.shape} "
                         f"{data.dtype}")
    if labels.shape != (data.shape[0],) or labels.dtype.kind not in "iu":
        raise ValueError(f"{path}: b'labels' must be {data.shape[0]} integers, got shape "
                         f"{labels.shape} dtype {labels.dtype}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels must lie in 0-9, got {labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_cifar10(data_dir, *, per_class: int | None = None, test_size: int | None = None
                 ) -> tuple[Split, list[str]]:
    """CIFAR-10's training and test sets, or their subsets, from ``data_dir``.

    Parameters
    ----------
    data_dir : path
        Holds ``cifar-10-batches-py/`` or its contents (see the module's docstring).
    per_class : int, optional
        Take the first ``per_class`` training images of each class, in file order
        (CIFAR-10-2k is ``per_class=200``); the batches are read only until every class has
        them. None: every training image of the files present.
    test_size : int, optional
        The first ``test_size`` images of ``test_batch``; None: all of them.

    Returns
    -------
    split : Split
    notes : list of str
        What was shrunk to fit the files (a class with fewer than ``per_class`` images, a test
        file with fewer than ``test_size``); empty when nothing was.

    Raises
    ------
    DataNotFound
        The files are not there (the message says what to download).
    ValueError
        A file is not a CIFAR-10 batch, or (with ``per_class``) a class has no training
        image at all.
    """
    folder = cifar10_dir(data_dir)
    xs, ys, files, notes = [], [], [], []
    for name in CIFAR10_TRAIN_FILES:
        if not (folder / name).is_file():
            continue
        X, y = read_cifar10_batch(folder / name)
        xs.append(X)
        ys.append(y)
        files.append(name)
        if per_class is not None and np.bincount(np.concatenate(ys), minlength=10).min() \
                >= per_class:
            break
    X_train, y_train = np.concatenate(xs), np.concatenate(ys)
    counts = np.bincount(y_train, minlength=10)
    if per_class is not None and counts.min() == 0:
        empty = [CIFAR10_CLASSES[c] for c in np.flatnonzero(counts == 0)]
        raise ValueError(f"the training batches in {folder} ({', '.join(files)}) hold no image "
                         f"of class {', '.join(empty)}")
    if per_class is not None:
        k = int(min(per_class, counts.min()))
        if k < per_class:
            notes.append(f"{per_class} training images per class requested, the files hold "
                         f"{int(counts.min())} of the rarest class: {k} per class, {10 * k} "
                         "in all")
        keep = np.sort(np.concatenate([np.flatnonzero(y_train == c)[:k] for c in range(10)]))
        X_train, y_train = X_train[keep], y_train[keep]
    X_test, y_test = read_cifar10_batch(folder / CIFAR10_TEST_FILE)
    files.append(CIFAR10_TEST_FILE)
    if test_size is not None:
        if len(X_test) < test_size:
            notes.append(f"{test_size} test images requested, {CIFAR10_TEST_FILE} holds "
                         f"{len(X_test)}: all of them")
        X_test, y_test = X_test[:test_size], y_test[:test_size]
    if not len(X_test):
        raise ValueError(f"{folder / CIFAR10_TEST_FILE} holds no image")
    return Split(X_train, y_train, X_test, y_test, str(folder), files), notes


# -- FashionMNIST --------------------------------------------------------------------------
_IDX_IMAGES, _IDX_LABELS = 0x00000803, 0x00000801


def _open_idx(folder: Path, name: str) -> bytes:
    for path in (folder / name, folder / name.removesuffix(".gz")):
        if path.is_file():
            raw = path.read_bytes()
            if raw[:2] == b"\x1f\x8b":      # gzip's magic: the files as published
                try:
                    return gzip.decompress(raw)
                except (OSError, EOFError) as exc:
                    raise ValueError(f"{path} is not a readable gzip file: {exc}") from None
            return raw
    raise DataNotFound(f"{name} is not in {folder}. {how_to_get('fashion-mnist')}")


def read_idx(raw: bytes, what: str = "IDX file") -> np.ndarray:
    """An IDX array of unsigned bytes: images (magic 0x803) (n, rows, cols) or labels
    (magic 0x801) (n,), uint8.

    Raises
    ------
    ValueError
        An unknown magic number, or fewer bytes than the header announces.
    """
    if len(raw) < 8:
        raise ValueError(f"{what} is too short for an IDX header ({len(raw)} bytes)")
    magic = int.from_bytes(raw[:4], "big")
    if magic not in (_IDX_IMAGES, _IDX_LABELS):
        raise ValueError(f"{what} has magic number {magic:#010x}, not 0x00000803 (images) or "
                         "0x00000801 (labels) of the IDX format")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{what} is too short for its {ndim}-dimensional IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(raw) < header + size:
        raise ValueError(f"{what} announces {shape} = {size} bytes of data and holds "
                         f"{len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, count=size, offset=header).reshape(shape).copy()


def load_fashion_mnist(data_dir, *, train_size: int | None = None,
                       test_size: int | None = None) -> tuple[Split, list[str]]:
    """FashionMNIST's training and test sets, or their first images, from ``data_dir``.

    Parameters
    ----------
    data_dir : path
        Holds the four IDX files (see the module's docstring).
    train_size, test_size : int, optional
        The first so many images of each set; None: all of them.

    Returns
    -------
    split : Split
        Images (n, 28, 28) uint8, labels (n,) int64.
    notes : list of str
        What was shrunk to fit the files; empty when nothing was.

    Raises
    ------
    DataNotFound
        A file is missing (the message says what to download).
    ValueError
        A file is not in the IDX format, images are not 28 x 28, labels outside 0-9, or an
        image file and its label file disagree on the number of items.
    """
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataNotFound(f"{folder} is not a folder. {how_to_get('fashion-mnist')}")
    out, notes = {}, []
    for part, size in (("train", train_size), ("test", test_size)):
        images_name, labels_name = FASHION_FILES[f"{part}_images"], FASHION_FILES[f"{part}_labels"]
        images = read_idx(_open_idx(folder, images_name), images_name)
        labels = read_idx(_open_idx(folder, labels_name), labels_name)
        if images.ndim != 3 or images.shape[1:] != (28, 28):
            raise ValueError(f"{images_name} must hold 28 x 28 images (magic 0x803), got "
                             f"shape {images.shape}")
        if labels.ndim != 1:
            raise ValueError(f"{labels_name} must hold labels (magic 0x801), got shape "
                             f"{labels.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{images_name} holds {len(images)} images and {labels_name} "
                             f"{len(labels)} labels")
        if labels.size and labels.max() > 9:
            raise ValueError(f"{labels_name}: labels must lie in 0-9, got up to {labels.max()}")
        if not len(images):
            raise ValueError(f"{images_name} holds no image")
        if size is not None:
            if len(images) < size:
                notes.append(f"{size} {part} images requested, {images_name} holds "
                             f"{len(images)}: all of them")
            images, labels = images[:size], labels[:size]
        out[part] = (images, labels.astype(np.int64))
    files = list(FASHION_FILES.values())
    return Split(*out["train"], *out["test"], str(folder), files), notes


__all__ = ["DataNotFound", "Split", "how_to_get", "load_cifar10", "load_fashion_mnist",
           "read_cifar10_batch", "read_idx", "cifar10_dir"]
