"""Real data: a BN network written in JAX on scikit-learn's digits, trained by GD+WD to EoS."""

from __future__ import annotations

import numpy as np

from .. import run_gd_wd
from ..models import from_jax
from ._common import save, subplots

DESCRIPTION = ("Real data: a batch-normalised tanh network written in JAX (models.from_jax) on "
               "scikit-learn's 8x8 digits, even vs odd, full-batch GD+WD (lr 1, wd 2e-4) from "
               "a small effective LR: it fits the training digits, enters EoS, holds eff. LR x "
               "sharpness at 2 while the sharpness falls; test accuracy on held-out digits.")

#: What the experiment needs beyond pysharp's plot extra: import name -> pip name.
REQUIRES = {"jax": "jax", "sklearn": "scikit-learn"}
INSTALL = "pip install 'pysharp[digits]'"

HIDDEN = 16          # rows of W: D = 16 x 64 = 1024 trained parameters
READOUT = 3.0        # ||a||: the outputs reach the +-1 targets without saturating tanh
INIT_NORM = 80.0     # eff. LR x sharpness about 0.17 at the start: stable, well below 2
LR = 1.0


def bn_tanh_loss(w, X, y, a):
    """Square loss of a BN tanh network with a fixed readout, in ``jax.numpy``.

    ``W = w.reshape(h, 64)`` is trained; each hidden unit is normalised over the
    training set with its exact mean and standard deviation (no eps, no affine
    parameters), so the loss is invariant to the scale of each row of ``W``.

    Parameters
    ----------
    w : jax.Array, shape (h * d,)
        The rows of W, flattened.
    X : jax.Array, shape (n, d)
        Training inputs.
    y : jax.Array, shape (n,)
        Targets, +1 (even digit) or -1 (odd digit).
    a : jax.Array, shape (h,)
        The fixed readout.

    Returns
    -------
    jax.Array, shape ()
        mean_i (a . tanh(BN(W x_i)) - y_i)^2.
    """
    import jax.numpy as jnp  # JAX is optional: imported when the loss is traced

    W = w.reshape(a.shape[0], X.shape[1])
    Z = X @ W.T
    Zc = Z - Z.mean(axis=0)
    Zh = Zc / jnp.sqrt((Zc * Zc).mean(axis=0))
    return jnp.mean((jnp.tanh(Zh) @ a - y) ** 2)


def readout(hidden: int = HIDDEN, scale: float = READOUT) -> np.ndarray:
    """The fixed readout: alternating signs, norm ``scale``."""
    return scale * np.where(np.arange(hidden) % 2 == 0, 1.0, -1.0) / np.sqrt(hidden)


def digits_split(n_train: int, seed: int = 0):
    """scikit-learn's digits (pixels / 16) split at random into training and held-out sets.

    Returns
    -------
    X_train, odd_train, X_test, odd_test : ndarray
        Inputs (n, 64) and labels (n,), 1 for an odd digit and 0 for an even one.
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    X, odd = digits.data / 16.0, digits.target % 2
    order = np.random.default_rng(seed).permutation(len(X))
    train, test = order[:n_train], order[n_train:]
    return X[train], odd[train], X[test], odd[test]


def outputs(thetas: np.ndarray, X_train: np.ndarray, X: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The network's outputs on ``X`` at each of ``thetas`` (K, D), shape (K, len(X)).

    Batch normalisation uses the training set's statistics (population statistics, as
    in the loss), so the outputs on ``X_train`` are those the loss sees.
    """
    W = np.asarray(thetas).reshape(len(thetas), len(a), X.shape[1]).transpose(0, 2, 1)
    Z = X_train @ W
    mean, sd = Z.mean(axis=1, keepdims=True), Z.std(axis=1, keepdims=True)
    return np.tanh((X @ W - mean) / sd) @ a


def accuracy(thetas: np.ndarray, X_train: np.ndarray, X: np.ndarray, odd: np.ndarray,
             a: np.ndarray) -> np.ndarray:
    """Fraction of ``X`` whose parity is predicted (odd where the output is negative), (K,)."""
    return np.mean((outputs(thetas, X_train, X, a) < 0) == odd, axis=1)


def build(n_train: int, hidden: int = HIDDEN):
    """The compiled model of ``bn_tanh_loss`` on ``n_train`` digits, and the split.

    Returns
    -------
    model : pysharp.models.JaxModel
        Checked against JAX by ``from_jax`` (``model.report``), one group per row of W.
    data : tuple
        ``digits_split(n_train)``.
    """
    data = digits_split(n_train)
    X_train, odd_train = data[0], data[1]
    model = from_jax(bn_tanh_loss, np.ones(hidden * X_train.shape[1]), X=X_train,
                     y=1.0 - 2.0 * odd_train, a=readout(hidden), groups=hidden, compile=True)
    return model, data


def _at(steps: np.ndarray, values: np.ndarray, step: int):
    """values at the first of ``steps`` at or after ``step``."""
    return values[min(int(np.searchsorted(steps, step)), len(steps) - 1)]


def _at_entry(tr, entry: int, train_acc: np.ndarray, test_acc: np.ndarray) -> dict:
    """The numbers at and after EoS entry (the first sharpness record at the edge); each is
    None for a run that never entered."""
    after = tr.eos_ratio[tr.sharpness_steps >= entry]
    s_entry = float(_at(tr.sharpness_steps, tr.sharpness, entry))
    numbers = {
        "eos_ratio_median_after_entry": float(np.median(after)),
        "eos_ratio_min_after_entry": float(after.min()),
        "eos_ratio_max_after_entry": float(after.max()),
        "eos_ratio_fraction_in_band": float(np.mean(np.abs(after - 2) <= 2 * tr.eos_tol)),
        "eos_ratio_samples": int(after.size),
        "sharpness_at_entry": s_entry,
        "sharpness_end_over_entry": float(tr.sharpness[-1] / s_entry),
        "sharpness_fell": bool(tr.sharpness[-1] < s_entry),
        "train_loss_at_entry": float(_at(tr.steps, tr.loss, entry)),
        "train_accuracy_at_entry": float(_at(tr.theta_steps, train_acc, entry)),
        "test_accuracy_at_entry": float(_at(tr.theta_steps, test_acc, entry)),
    }
    return numbers if entry >= 0 else dict.fromkeys(numbers)


def run(out, quick: bool) -> dict:
    n_train, wd, steps, every = (200, 1e-3, 3_000, 50) if quick else (400, 2e-4, 20_000, 100)
    model, (X_train, odd_train, X_test, odd_test) = build(n_train)
    a = readout()
    w0 = model.random_point(seed=1, norm=INIT_NORM)
    tr = run_gd_wd(model, w0, LR, wd, steps, record_every=10, sharpness_every=every,
                   theta_every=steps // 100)
    train_acc = accuracy(tr.theta, X_train, X_train, odd_train, a)
    test_acc = accuracy(tr.theta, X_train, X_test, odd_test, a)

    entry = int(tr.eos_entry_step)
    entered = entry >= 0
    numbers = {
        "eos_entered": entered, "eos_entry_step": entry,
        "eos_ratio_start": float(tr.eos_ratio[0]),
        "eos_band": [2 * (1 - tr.eos_tol), 2 * (1 + tr.eos_tol)],
        **_at_entry(tr, entry, train_acc, test_acc),
        "sharpness_start": float(tr.sharpness[0]), "sharpness_max": float(tr.sharpness.max()),
        "sharpness_end": float(tr.sharpness[-1]),
        "sharpness_all_converged": bool(tr.sharpness_converged.all()),
        "train_loss_start": float(tr.loss[0]), "train_loss_end": float(tr.loss[-1]),
        # the loss alternates at the edge: the mean over the last tenth of the run
        "train_loss_end_mean": float(tr.loss[-len(tr.loss) // 10:].mean()),
        "train_accuracy_end": float(train_acc[-1]),
        "test_accuracy_start": float(test_acc[0]), "test_accuracy_end": float(test_acc[-1]),
        "test_accuracy_chance": float(max(odd_test.mean(), 1 - odd_test.mean())),
        "diverged": bool(tr.diverged),
        "check_passed": bool(all(model.report.passed.values())),
    }

    fig, ax = subplots(2, 2, figsize=(12, 8))
    ax = ax.ravel()
    ax[0].semilogy(tr.steps, tr.loss, lw=0.6)
    ax[0].set(xlabel="step", ylabel="training loss", title="training loss (square loss)")
    ax[1].plot(tr.sharpness_steps, tr.eos_ratio, ".-", lw=0.8, ms=3,
               label="eff. LR x sharpness")
    ax[1].axhspan(*numbers["eos_band"], color="0.85", label="EoS band 2 (1 +- eos_tol)")
    ax[1].axhline(2, color="k", lw=0.6)
    ax[1].set(xlabel="step", ylabel="eff. LR x spherical sharpness",
              title="eff. LR x sharpness reaches 2 and stays")
    ax[2].plot(tr.sharpness_steps, tr.sharpness, ".-", lw=0.8, ms=3)
    ax[2].set(xlabel="step", ylabel="spherical sharpness lambda_1",
              title="sharpness falls after entry")
    ax[3].plot(tr.theta_steps, train_acc, label="train")
    ax[3].plot(tr.theta_steps, test_acc, label=f"held out ({len(X_test)} digits)")
    ax[3].axhline(numbers["test_accuracy_chance"], color="0.5", ls="--", lw=0.8,
                  label="chance (majority class)")
    ax[3].set(xlabel="step", ylabel="accuracy (even vs odd)", title="accuracy")
    for panel in ax:
        if entered:
            panel.axvline(entry, color="C3", ls=":", lw=0.8,
                          label=f"EoS entry (step {entry})" if panel is ax[0] else None)
    for panel in ax[:2]:
        panel.legend(fontsize=8)
    ax[3].legend(fontsize=8, loc="lower right")
    settings = {"model": f"BN tanh net in JAX (from_jax), W {HIDDEN} x 64 trained, fixed "
                         f"readout ||a|| = {READOUT:g}, D {model.dim}",
                "data": f"digits even vs odd, {n_train} train / {len(X_test)} held out",
                "lr": LR, "wd": wd, "steps": steps, "init": f"random, ||w0|| = {INIT_NORM:g}",
                "sharpness every": every}
    figure = save(fig, out, "digits", "Digits, BN network in JAX: EoS entry, eff. LR x "
                  "sharpness held at 2, sharpness falling", settings)
    return {"figures": [figure], "settings": settings, "model": settings["model"],
            "lr": LR, "wd": wd, "steps": steps, "n_train": n_train, "n_test": len(X_test),
            "hidden": HIDDEN, "dim": model.dim, **numbers}
