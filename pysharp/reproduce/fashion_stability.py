"""Ma & Ying's Figure 1 on FashionMNIST: a fully connected net trained by SGD at several
learning rates and batch sizes; at each end point the sharpness a, the non-uniformity s and
the parameter- and input-gradient moments g_W and g_x.

The network is plain JAX, ``predict(params, x)`` for one 28 x 28 image (flattened, pixels
/ 255) -> 10 outputs, ReLU hidden layers, trained on the square loss against one-hot labels,
L = (1/2n) sum_i ||f(x_i) - e_{y_i}||^2, through :func:`pysharp.models.square_loss_from_jax`.
Every (lr, batch) pair is one trajectory of one vmapped :func:`pysharp.run_sgd` call in XLA
(sampling without replacement, the same start w0 for all). At each end point that did not
diverge, :func:`pysharp.stability.sharpness_nonuniformity` (chunked Lanczos, the Jacobian
never formed) gives a = lambda_max(H) and s = sqrt(lambda_max(Sigma)), and
:func:`pysharp.stability.input_smoothness` (k = 1) gives
g_W = [(1/n) sum_i ||d f(x_i) / dW||^2]^(1/2) and g_x = [(1/n) sum_i ||d f(x_i) / dx||^2]^(1/2),
entrywise over the 10 outputs. Figure 1 of the paper is the scatter of g_W against g_x, the
points coloured by learning rate and batch size: bigger lr and smaller batches give smaller
g_W and g_x, and the two are strongly correlated.

The text of the paper in ``shared/papers`` gives neither the width, nor the depth, nor the
grid: ``FULL`` is this entry's reading (three hidden layers of 500, the 60 000 training
images, as in Wu, Ma & E 2018's FashionMNIST experiments on which Ma & Ying build), meant for a
GPU; the default shrinks width, images and steps to run on 2 CPU cores in minutes, and says so
on the figure and in the JSON; ``QUICK`` is a smoke run of seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import run_sgd
from ..models import square_loss_from_jax
from ..stability import input_smoothness, kappa, sharpness_nonuniformity
from . import plt
from ._common import footer, save, subplots
from ._datasets import DataNotFound, how_to_get, load_fashion_mnist

DESCRIPTION = ("Ma & Ying's Figure 1: a fully connected ReLU net in JAX on FashionMNIST, "
               "square loss on one-hot labels, trained by SGD (in XLA) over a grid of learning "
               "rates and batch sizes; at each end point sharpness a, non-uniformity s and the "
               "gradient moments g_W (parameters) and g_x (inputs); needs --data DIR with "
               "FashionMNIST's IDX files; the default shrinks width, images and steps for 2 CPU "
               "cores, --full is this entry's reading of the paper's size (GPU).")

REQUIRES = {"jax": "jax"}
INSTALL = "pip install jax (or pip install 'pysharp[digits]')"
#: The dataset ``--data`` must hold (``_datasets.how_to_get`` says how to get it).
DATASET = "fashion-mnist"
CLASSES = 10


@dataclass(frozen=True)
class Setting:
    """One size of the experiment: the network, the data and the grid of SGD runs."""

    width: int            # units per hidden layer
    depth: int            # hidden layers
    train_size: int       # the first images of the training file
    test_size: int        # the first images of the test file
    lrs: tuple            # learning rates (the grid's rows)
    batches: tuple        # batch sizes (the grid's columns)
    steps: int
    seed: int = 0
    lanczos_tol: float = 1e-6


#: This entry's reading of the paper's setting (the text gives no width, depth or grid).
FULL = Setting(width=500, depth=3, train_size=60_000, test_size=10_000,
               lrs=(0.005, 0.01, 0.02, 0.05), batches=(10, 50, 200, 1000), steps=100_000)
#: 2 CPU cores, minutes: width 32, the first 1000 training images, 3000 steps.
DEFAULT = Setting(width=32, depth=3, train_size=1000, test_size=1000,
                  lrs=(0.005, 0.01, 0.02, 0.04), batches=(5, 25, 100), steps=3000)
#: Seconds: a smoke run.
QUICK = Setting(width=8, depth=2, train_size=100, test_size=100, lrs=(0.005, 0.02),
                batches=(5, 25), steps=300)


# -- the network, in plain JAX ---------------------------------------------------------------
def init_params(s: Setting, inputs: int = 784, classes: int = CLASSES) -> dict:
    """He-normal weights ``W0``, ``W1``, ... (out, in) and zero biases ``b0``, ``b1``, ...,
    float64 NumPy; the last layer (``W{depth}``) has ``classes`` outputs."""
    rng = np.random.default_rng(s.seed)
    sizes = [inputs] + [s.width] * s.depth + [classes]
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"W{i}"] = rng.standard_normal((fan_out, fan_in)) * np.sqrt(2.0 / fan_in)
        params[f"b{i}"] = np.zeros(fan_out)
    return params


def predict(params, x):
    """The network's 10 outputs for ONE image x (784,): ReLU after every hidden layer, the
    last layer linear."""
    import jax  # lazy: JAX is optional, imported when the network is traced

    layers = len(params) // 2
    h = x
    for i in range(layers):
        h = params[f"W{i}"] @ h + params[f"b{i}"]
        if i < layers - 1:
            h = jax.nn.relu(h)
    return h


def prepare(images: np.ndarray) -> np.ndarray:
    """uint8 (n, 28, 28) -> float64 (n, 784): pixels / 255."""
    return images.reshape(len(images), -1).astype(np.float64) / 255.0


def accuracy(model, W: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fraction of ``X`` classified as ``y`` (argmax of the outputs) at each row of W, (T,)."""
    import jax  # lazy: JAX is optional, imported when the accuracy is measured
    import jax.numpy as jnp

    out = jax.jit(lambda p, X: jnp.argmax(jax.vmap(lambda x: predict(p, x))(X), axis=1))
    Xj = jnp.asarray(X, jnp.float32)      # float32 outside JAX's x64 mode: argmax only

    def params(w):
        return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float32), model.unravel(w))
    return np.array([float(np.mean(np.asarray(out(params(w), Xj)) == y))
                     if np.all(np.isfinite(w)) else np.nan for w in W])


# -- the experiment --------------------------------------------------------------------------
def setting_for(quick: bool, full: bool) -> Setting:
    if quick and full:
        raise ValueError("--quick and --full exclude each other")
    return QUICK if quick else FULL if full else DEFAULT


def _shrinkage(s: Setting) -> list[str]:
    """How ``s`` departs from ``FULL``, in words (empty for FULL)."""
    out = []
    if (s.width, s.depth) != (FULL.width, FULL.depth):
        out.append(f"{s.depth} hidden layers of {s.width}, not {FULL.depth} of {FULL.width}")
    if s.train_size != FULL.train_size:
        out.append(f"the first {s.train_size} training images, not {FULL.train_size}")
    if s.test_size != FULL.test_size:
        out.append(f"the first {s.test_size} test images, not {FULL.test_size}")
    if s.steps != FULL.steps:
        out.append(f"{s.steps} SGD steps, not {FULL.steps}")
    if (tuple(s.lrs), tuple(s.batches)) != (FULL.lrs, FULL.batches):
        out.append(f"grid lr {list(s.lrs)} x B {list(s.batches)}")
    return out


def run(out, quick: bool, *, data=None, full: bool = False, setting: Setting | None = None
        ) -> dict:
    """Train the grid by SGD and measure; write ``fashion-stability.png``; return the numbers.

    Parameters
    ----------
    data : path
        The folder holding FashionMNIST's four IDX files (``--data``).
    full : bool
        This entry's reading of the paper's size (a GPU's work) instead of the 2-core default.
    setting : Setting, optional
        Overrides the size (tests).

    Raises
    ------
    pysharp.reproduce._datasets.DataNotFound
        No ``data``, or no FashionMNIST files in it: the message says what to download.
    """
    if data is None:
        raise DataNotFound(f"`pysharp reproduce fashion-stability` needs --data DIR. "
                           f"{how_to_get(DATASET)}")
    s = setting or setting_for(quick, full)
    split, notes = load_fashion_mnist(data, train_size=s.train_size, test_size=s.test_size)
    X_train, X_test = prepare(split.X_train), prepare(split.X_test)
    n = len(split.y_train)
    batches = [b for b in s.batches if b <= n]
    if len(batches) < len(s.batches):
        notes.append(f"batch sizes above n = {n} dropped: "
                     f"{[b for b in s.batches if b > n]}")
    if not batches:
        batches = [n]
    model = square_loss_from_jax(predict, init_params(s), X_train,
                                 np.eye(CLASSES)[split.y_train])
    lr = np.repeat(np.asarray(s.lrs, float), len(batches))
    B = np.tile(np.asarray(batches, int), len(s.lrs))
    w0 = model.initial_point()
    res = run_sgd(model, np.tile(w0, (len(lr), 1)), lr, B, s.steps, seed=s.seed,
                  record_every=max(1, s.steps // 100))
    runs = []
    train_acc = accuracy(model, res.w, X_train, split.y_train)
    test_acc = accuracy(model, res.w, X_test, split.y_test)
    ok = ~np.asarray(res.diverged)
    a = np.full(len(lr), np.nan)
    s_ = np.full(len(lr), np.nan)
    conv = np.zeros(len(lr), bool)
    gW = np.full(len(lr), np.nan)
    gx = np.full(len(lr), np.nan)
    if ok.any():
        q = sharpness_nonuniformity(model, res.w[ok], method="lanczos", tol=s.lanczos_tol,
                                    seed=s.seed)
        a[ok], s_[ok], conv[ok] = q.sharpness, q.nonuniformity, q.converged
        g = input_smoothness(model, res.w[ok])
        gW[ok], gx[ok] = g.g_W, g.g_x
    for t in range(len(lr)):
        kap = kappa(n, int(B[t]))
        runs.append({
            "lr": float(lr[t]), "batch": int(B[t]), "diverged": bool(res.diverged[t]),
            "diverged_step": int(res.diverged_step[t]),
            "loss_start": float(res.loss[0, t]), "loss_end": float(res.loss[-1, t]),
            "train_accuracy": float(train_acc[t]), "test_accuracy": float(test_acc[t]),
            "sharpness": float(a[t]), "nonuniformity": float(s_[t]),
            "lanczos_converged": bool(conv[t]),
            "a_max": 2.0 / float(lr[t]),   # a <= 2 / lr: necessary for linear stability
            # s <= 1 / (lr sqrt(kappa)): the sufficient criterion's bound on s alone
            "s_max": float(np.inf if kap == 0 else 1.0 / (lr[t] * np.sqrt(kap))),
            "g_W": float(gW[t]), "g_x": float(gx[t])})
    return _report(out, s, model, res, runs, notes, n, len(split.y_test), split)


def _corr(x, y) -> float | None:
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if keep.sum() < 3:
        return None
    return float(np.corrcoef(np.log(x[keep]), np.log(y[keep]))[0, 1])


def _rank_corr(x, y) -> float | None:
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return None
    rx = np.argsort(np.argsort(x[keep])).astype(float)
    ry = np.argsort(np.argsort(y[keep])).astype(float)
    return float(np.corrcoef(rx, ry)[0, 1])


def _report(out, s, model, res, runs, notes, n_train, n_test, split) -> dict:
    shrink = _shrinkage(s) + notes
    ok = [r for r in runs if not r["diverged"]]
    lr_over_b = [r["lr"] / r["batch"] for r in ok]
    numbers = {
        "runs_total": len(runs), "runs_diverged": len(runs) - len(ok),
        "corr_log_gW_log_gx": _corr([r["g_W"] for r in ok], [r["g_x"] for r in ok]),
        # Ma & Ying: bigger lr and smaller batch -> smaller g_W, g_x (negative correlations)
        "rank_corr_lr_over_batch_gW": _rank_corr(lr_over_b, [r["g_W"] for r in ok]),
        "rank_corr_lr_over_batch_gx": _rank_corr(lr_over_b, [r["g_x"] for r in ok]),
        "rank_corr_lr_over_batch_sharpness": _rank_corr(lr_over_b,
                                                        [r["sharpness"] for r in ok]),
        "all_below_2_over_lr": bool(all(r["sharpness"] <= r["a_max"] for r in ok)),
        "all_s_below_s_max": bool(all(r["nonuniformity"] <= r["s_max"] for r in ok)),
        "max_loss_end": max((r["loss_end"] for r in ok), default=None),
        "lanczos_all_converged": bool(all(r["lanczos_converged"] for r in ok)),
    }
    settings = {"model": f"FC ReLU net in JAX (XLA), {s.depth} x {s.width} hidden, D "
                         f"{model.dim}, square loss on one-hot labels",
                "data": f"FashionMNIST, {n_train} train / {n_test} test, pixels / 255",
                "lr": list(s.lrs), "batch": sorted({r['batch'] for r in runs}),
                "steps": s.steps, "sampling": "without replacement", "seed": s.seed}
    paper = "this entry's reading of the paper's setting" if not shrink else \
        "SHRUNK: " + "; ".join(shrink)

    fig, ax = subplots(2, 2, figsize=(12, 9))
    ax = ax.ravel()
    batches = sorted({r["batch"] for r in runs})
    markers = "os^Dvp*hX"
    lrs = np.array(sorted({r["lr"] for r in runs}))
    cmap = _cmap()
    colour = {lr: cmap(i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}
    for j, b in enumerate(batches):
        rs = [r for r in ok if r["batch"] == b]
        for r in rs:
            ax[0].scatter(r["g_x"], r["g_W"], color=colour[r["lr"]], marker=markers[j % 9],
                          s=50, edgecolor="k", lw=0.5)
        ax[0].scatter([], [], color="0.6", marker=markers[j % 9], edgecolor="k", lw=0.5,
                      label=f"B = {b}")
        x = [r["lr"] for r in rs]
        ax[1].plot(x, [r["sharpness"] for r in rs], markers[j % 9] + "-", label=f"B = {b}")
        ax[2].plot(x, [r["nonuniformity"] for r in rs], markers[j % 9] + "-",
                   color=f"C{j}", label=f"B = {b}")
        ax[2].plot(lrs, [1 / (lr * np.sqrt(kappa(n_train, b))) if kappa(n_train, b) > 0
                         else np.nan for lr in lrs], ":", color=f"C{j}", lw=0.8)
    for lr in lrs:
        ax[0].scatter([], [], color=colour[lr], marker="o", label=f"lr {lr:g}")
    ax[0].set(xlabel="g_x (input gradient)", ylabel="g_W (parameter gradient)",
              title="g_W vs g_x at SGD's end points (Ma & Ying Fig. 1)",
              xscale="log", yscale="log")
    ax[1].plot(lrs, 2 / lrs, "k--", lw=0.8, label="2 / lr")
    ax[1].set(xlabel="learning rate", ylabel="sharpness a = lambda_max(H)", xscale="log",
              yscale="log", title="sharpness at the end point")
    ax[2].set(xlabel="learning rate", ylabel="non-uniformity s = sqrt(lambda_max(Sigma))",
              xscale="log", yscale="log",
              title="non-uniformity (dotted: 1 / (lr sqrt(kappa)) per B)")
    for j, r in enumerate(runs):
        ax[3].semilogy(res.steps, res.loss[:, j], lw=0.8, color=colour[r["lr"]],
                       ls=["-", "--", ":", "-."][batches.index(r["batch"]) % 4])
    ax[3].set(xlabel="step", ylabel="training loss (full batch)",
              title="training loss (colour: lr; line style: batch)")
    for panel in ax[:3]:
        if panel.get_legend_handles_labels()[0]:
            panel.legend(fontsize=8)
    footer(fig, paper, bool(shrink))
    figure = save(fig, out, "fashion-stability", "FashionMNIST, FC net, SGD over lr x batch: "
                  "sharpness, non-uniformity, g_W vs g_x (Ma & Ying Fig. 1)", settings)
    return {"figures": [figure], "settings": settings, "setting": asdict(s),
            "paper_setting": not shrink, "shrinkage": shrink, "data_source": split.source,
            "data_files": split.files, "n_train": n_train, "n_test": n_test,
            "dim": model.dim, "runs": runs, **numbers}


def _cmap():
    return plt().get_cmap("viridis")


__all__ = ["run", "Setting", "FULL", "DEFAULT", "QUICK", "predict", "init_params", "prepare"]
