"""`pysharp reproduce fashion-stability`: Ma & Ying's FC net on FashionMNIST, SGD over a grid.

The tests write FashionMNIST's gzipped IDX files with a few dozen 28 x 28 images in tmp_path
(``_reproduce_cases.write_fashion``). The fast tests: the refusal without data, the network
against a NumPy forward pass, and a tiny run end to end (a 2 x 2 grid, 40 steps, a net of
width 4: its cost is XLA compiling the SGD loop, the Jacobian chunks and the Lanczos
products), and the command line's --quick on 100 uncompressed images. All five took 20 s
on the shared 2-core Xeon.
"""

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("matplotlib")
jax = pytest.importorskip("jax")

from _reproduce_cases import write_fashion  # noqa: E402

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402
from pysharp.reproduce import fashion_stability as fs  # noqa: E402

TINY = fs.Setting(width=4, depth=2, train_size=30, test_size=10, lrs=(0.002, 0.005),
                  batches=(5, 40), steps=40)


def test_without_data_it_says_what_to_download_and_exits_2(tmp_path, capsys):
    assert main(["reproduce", "fashion-stability", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--data DIR" in err and "train-images-idx3-ubyte.gz" in err
    assert "t10k-labels-idx1-ubyte.gz" in err
    assert not list(tmp_path.iterdir())
    assert "--data DIR" in reproduce.missing("fashion-stability")
    assert reproduce.missing("fashion-stability", data=tmp_path) is None
    with pytest.raises(ValueError, match="exclude"):
        fs.setting_for(quick=True, full=True)
    # a folder without the files: the same message, exit 2
    assert main(["reproduce", "fashion-stability", "--quick", "--data", str(tmp_path),
                 "--out", str(tmp_path / "out")]) == 2
    assert "train-images-idx3-ubyte.gz" in capsys.readouterr().err


def test_the_network_is_the_numpy_forward_pass_and_the_sizes_say_their_shrinkage():
    s = replace(TINY, width=5, depth=3)
    params = fs.init_params(s)
    assert [params[f"W{i}"].shape for i in range(4)] == [(5, 784), (5, 5), (5, 5), (10, 5)]
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in params.items()}
    images = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    X = fs.prepare(images)
    assert X.shape == (3, 784) and X.max() <= 1.0 and X[0, 1] == images[0, 0, 1] / 255
    want = []
    for x in X:
        h = x
        for i in range(4):
            h = params[f"W{i}"] @ h + params[f"b{i}"]
            h = np.maximum(h, 0) if i < 3 else h
        want.append(h)
    jp = {k: jax.numpy.asarray(v, jax.numpy.float32) for k, v in params.items()}
    got = np.array([fs.predict(jp, jax.numpy.asarray(x, jax.numpy.float32)) for x in X])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert fs._shrinkage(fs.FULL) == []
    shrink = " ".join(fs._shrinkage(fs.DEFAULT))
    assert "3 hidden layers of 32, not 3 of 500" in shrink and "first 1000 training" in shrink


def test_tiny_run_end_to_end_writes_its_figure_numbers_and_shrinkage(tmp_path):
    (tmp_path / "data").mkdir()
    write_fashion(tmp_path / "data", n_train=36, n_test=8)
    out = tmp_path / "out"
    out.mkdir()
    summary = fs.run(out, False, data=tmp_path / "data", setting=TINY)
    assert summary["figures"] == ["fashion-stability.png"]
    assert (out / "fashion-stability.png").stat().st_size > 10_000
    json.loads(json.dumps(summary, default=float))
    shrink = " ".join(summary["shrinkage"])
    # 10 test images requested, 8 in the file; B = 40 > n = 30 dropped: all said
    assert "10 test images requested" in shrink and "batch sizes above n = 30" in shrink
    assert summary["n_train"] == 30 and summary["n_test"] == 8 and not summary["paper_setting"]
    runs = summary["runs"]
    assert [(r["lr"], r["batch"]) for r in runs] == [(0.002, 5), (0.005, 5)]
    assert summary["runs_total"] == 2 and summary["runs_diverged"] == 0
    for r in runs:
        assert r["loss_end"] < r["loss_start"] and r["lanczos_converged"]
        assert 0 < r["sharpness"] and 0 <= r["nonuniformity"]
        assert r["g_W"] > 0 and r["g_x"] > 0 and 0 <= r["test_accuracy"] <= 1
        assert r["a_max"] == pytest.approx(2 / r["lr"])
    assert summary["settings"]["model"].startswith("FC ReLU net")


def test_the_measures_are_pysharps_at_the_run_end_points(tmp_path):
    """The JSON's a, s, g_W, g_x are sharpness_nonuniformity's and input_smoothness's."""
    import pysharp as ps
    from pysharp import stability

    write_fashion(tmp_path, n_train=12, n_test=3)
    split, _ = fs.load_fashion_mnist(tmp_path)
    model = ps.models.square_loss_from_jax(fs.predict, fs.init_params(TINY),
                                           fs.prepare(split.X_train), np.eye(10)[split.y_train])
    w = model.initial_point()
    q = stability.sharpness_nonuniformity(model, w, method="gram")
    ql = stability.sharpness_nonuniformity(model, w, method="lanczos", tol=1e-9)
    assert ql.sharpness == pytest.approx(q.sharpness, rel=1e-6)
    assert ql.nonuniformity == pytest.approx(q.nonuniformity, rel=1e-5)
    g = stability.input_smoothness(model, w)
    f32 = jax.numpy.float32     # JAX's default precision outside pysharp's x64 calls
    p32 = {k: jax.numpy.asarray(np.asarray(v), f32) for k, v in model.unravel(w).items()}
    J = jax.vmap(jax.jacrev(lambda x: fs.predict(p32, x)))(
        jax.numpy.asarray(fs.prepare(split.X_train), f32))
    assert g.g_x == pytest.approx(float(np.sqrt(np.mean(np.sum(np.asarray(J) ** 2,
                                                                axis=(1, 2))))), rel=1e-4)


def test_cli_quick_end_to_end_writes_the_json(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    write_fashion(tmp_path / "data", n_train=100, n_test=20, compress=False)
    assert main(["reproduce", "fashion-stability", "--quick", "--data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "fashion-stability.json").read_text())
    assert saved["quick"] is True and saved["n_train"] == 100 and saved["n_test"] == 20
    assert saved["runs_total"] == 4 and saved["setting"]["width"] == fs.QUICK.width
    assert "100 test images requested" in " ".join(saved["shrinkage"])
    assert "fashion-stability.png" in capsys.readouterr().out
