"""The dataset readers of ``pysharp reproduce``: CIFAR-10's python batches and FashionMNIST's
IDX files, written in the published formats at a few images each (``_reproduce_cases``)."""

import gzip
import os
import pickle

import numpy as np
import pytest
from _reproduce_cases import idx, write_cifar, write_cifar_batch, write_fashion

from pysharp.reproduce import _datasets as ds


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar_reads_the_published_layout(tmp_path, protocol):
    X, y, Xt, yt = write_cifar(tmp_path, protocol=protocol)
    split, notes = ds.load_cifar10(tmp_path)
    assert notes == [] and split.files == ["data_batch_1", "data_batch_2", "test_batch"]
    np.testing.assert_array_equal(split.X_train, X)
    np.testing.assert_array_equal(split.y_train, y)
    np.testing.assert_array_equal(split.X_test, Xt)
    np.testing.assert_array_equal(split.y_test, yt)
    assert split.X_train.dtype == np.uint8 and split.y_train.dtype == np.int64
    # b'data' rows are 1024 red, 1024 green, 1024 blue values, each image row by row
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_1", "rb") as fh:
        raw = pickle.load(fh, encoding="bytes")[b"data"]
    assert split.X_train[0, 1, 2, 5] == raw[0, 1024 + 2 * 32 + 5]
    # the folder's contents given directly
    same, _ = ds.load_cifar10(tmp_path / "cifar-10-batches-py")
    np.testing.assert_array_equal(same.X_train, X)


def test_cifar_subset_takes_the_first_images_of_each_class_and_shrinks_to_fit(tmp_path):
    X, y, _, _ = write_cifar(tmp_path, per_batch=(12, 12, 12, 0, 0), n_test=7)
    # labels 0, 3, 6, 9, 2, 5, 8, 1, 4, 7, ...: 3 of each class within the first 30 images,
    # so data_batch_3 is not needed
    split, notes = ds.load_cifar10(tmp_path, per_class=2, test_size=5)
    assert notes == [] and split.files == ["data_batch_1", "data_batch_2", "test_batch"]
    assert np.bincount(split.y_train).tolist() == [2] * 10 and len(split.X_test) == 5
    first = np.sort(np.concatenate([np.flatnonzero(y == c)[:2] for c in range(10)]))
    np.testing.assert_array_equal(split.X_train, X[first])
    # more than the files hold: every class shrinks to the rarest's count, and says so
    split, notes = ds.load_cifar10(tmp_path, per_class=200, test_size=10_000)
    assert np.bincount(split.y_train).tolist() == [3] * 10 and len(split.X_test) == 7
    assert len(notes) == 2 and "3 per class, 30 in all" in notes[0] and "holds 7" in notes[1]


def test_cifar_missing_or_wrong_files_are_refused_in_words(tmp_path):
    with pytest.raises(ds.DataNotFound, match="cifar-10-python.tar.gz"):
        ds.load_cifar10(tmp_path)
    assert isinstance(ds.DataNotFound("x"), ValueError)
    folder = tmp_path / "c"
    folder.mkdir()
    write_cifar_batch(folder / "data_batch_1", np.zeros((2, 3, 32, 32)), [0, 1])
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="not a CIFAR-10 batch"):
        ds.load_cifar10(folder)
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, fh)
    with pytest.raises(ValueError, match=r"\(N, 3072\) uint8"):
        ds.load_cifar10(folder)
    write_cifar_batch(folder / "test_batch", np.zeros((2, 3, 32, 32)), [0, 11])
    with pytest.raises(ValueError, match="0-9"):
        ds.load_cifar10(folder)
    # a pickle that would run code is refused, not run
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({b"data": os.getcwd, b"labels": []}, fh)
    with pytest.raises(ValueError, match="not part of a CIFAR-10 batch"):
        ds.read_cifar10_batch(folder / "test_batch")
    # a class with no training image at all cannot make a class-balanced subset
    write_cifar_batch(folder / "test_batch", np.zeros((2, 3, 32, 32)), [0, 1])
    with pytest.raises(ValueError, match="no image of class bird"):
        ds.load_cifar10(folder, per_class=1)


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_reads_the_idx_files(tmp_path, compress):
    arrays = write_fashion(tmp_path, compress=compress)
    split, notes = ds.load_fashion_mnist(tmp_path)
    assert notes == []
    np.testing.assert_array_equal(split.X_train, arrays["train"][0])
    np.testing.assert_array_equal(split.y_train, arrays["train"][1])
    np.testing.assert_array_equal(split.X_test, arrays["t10k"][0])
    np.testing.assert_array_equal(split.y_test, arrays["t10k"][1])
    assert split.X_train.shape == (9, 28, 28) and split.y_test.dtype == np.int64
    split, notes = ds.load_fashion_mnist(tmp_path, train_size=5, test_size=60_000)
    assert len(split.X_train) == 5 and len(split.X_test) == 4
    assert notes == ["60000 test images requested, t10k-images-idx3-ubyte.gz holds 4: all of "
                     "them"]


def test_fashion_missing_or_wrong_files_are_refused_in_words(tmp_path):
    with pytest.raises(ds.DataNotFound, match="train-images-idx3-ubyte.gz"):
        ds.load_fashion_mnist(tmp_path)
    with pytest.raises(ds.DataNotFound, match="not a folder"):
        ds.load_fashion_mnist(tmp_path / "nowhere")
    write_fashion(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte.gz"
    labels.write_bytes(idx(0x801, (8,), np.zeros(8)))
    with pytest.raises(ValueError, match="9 images and .* 8 labels"):
        ds.load_fashion_mnist(tmp_path)
    labels.write_bytes(idx(0x803, (9,), np.zeros(9)))     # the images' magic
    with pytest.raises(ValueError, match="magic"):
        ds.load_fashion_mnist(tmp_path)
    labels.write_bytes(idx(0x801, (9,), np.zeros(5)))     # truncated
    with pytest.raises(ValueError, match="holds 5"):
        ds.load_fashion_mnist(tmp_path)
    labels.write_bytes(gzip.compress(b"\x00\x00\x08\x01")[:-3])
    with pytest.raises(ValueError, match="gzip"):
        ds.load_fashion_mnist(tmp_path)
    labels.write_bytes(idx(0x801, (9,), np.zeros(9)))
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(idx(0x803, (4, 14, 56),
                                                             np.zeros(4 * 28 * 28)))
    with pytest.raises(ValueError, match="28 x 28"):
        ds.load_fashion_mnist(tmp_path)


def test_how_to_get_names_the_files_and_where_they_go():
    assert "cifar-10-batches-py" in ds.how_to_get("cifar10")
    assert all(name in ds.how_to_get("fashion-mnist") for name in ds.FASHION_FILES.values())
    with pytest.raises(ValueError):
        ds.how_to_get("mnist")
