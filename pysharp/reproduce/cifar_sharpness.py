"""Lyu, Li & Arora's Figure 2 on CIFAR-10-2k: scale-invariant VGG-11, full-batch GD+WD.

The network is plain JAX (``lax.conv_general_dilated``, batch statistics over the whole
training set, integer-label cross-entropy), run untraced through pysharp's XLA path
(:func:`pysharp.models.from_jax`, ``backend="jax"``): the engine's GD+WD with warm-started
Lanczos for the spherical sharpness, and a jitted forward pass for train and test accuracy at
the run's theta snapshots (the network is scale-invariant, so the accuracy of theta_t is that of
w_t: exact, and no second run).

Scale invariance in every trained parameter (the paper's Appendix Q.1 changes to VGG-11): every
3 x 3 convolution has no bias and is followed by batch normalisation without affine
parameters and without epsilon, so the loss is invariant to the scale of each output channel's
filter; the last linear layer (no bias) is followed by a batch normalisation of the logits
with a fixed scale ``LOGIT_SCALE`` and no shift, so it is invariant to the scale of each class's
row. Activations are Swish (the paper's VGG-11 of Figure 2). The loss is then invariant to the
scale of each leaf, and of the whole of w, exactly.

Three sizes: ``FULL`` is the paper's setting (CIFAR-10-2k: the first 200 training images of
each class, 32 x 32, VGG-11 at full width, meant for a GPU); the default shrinks width, images
and steps to run on 2 CPU cores in minutes; ``QUICK`` is a smoke run of seconds. Every
shrinkage is written on the figure and in the JSON. ``--net resnet20`` (``run(...,
net="resnet20")``) runs the paper's scale-invariant ResNet-20 in the same three sizes
(``RESNET20_FULL``, ``RESNET20_DEFAULT``, ``RESNET20_QUICK``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import run_gd_wd
from ..models import from_jax
from ._common import footer, save, subplots
from ._datasets import DataNotFound, how_to_get, load_cifar10

DESCRIPTION = ("Lyu et al.'s Figure 2: scale-invariant VGG-11 (BN after every conv, Swish, "
               "BN'd logits) written in plain JAX on CIFAR-10-2k, full-batch GD+WD in XLA: "
               "train/test accuracy, spherical sharpness and eff. LR x sharpness (the edge at "
               "2); needs --data DIR with CIFAR-10's python batches; the default shrinks width, "
               "images and steps for 2 CPU cores, --full is the paper's size (GPU).")

REQUIRES = {"jax": "jax"}
INSTALL = "pip install jax (or pip install 'pysharp[digits]')"
#: The dataset ``--data`` must hold (``_datasets.how_to_get`` says how to get it).
DATASET = "cifar10"

VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
#: The fixed scale of the batch-normalised logits (the last BN's weight, not trained).
LOGIT_SCALE = 4.0


@dataclass(frozen=True)
class Setting:
    """One size of the experiment: the network, the data and the run."""

    width: float          # channels of VGG-11 times this
    image: int            # 32: CIFAR-10's images; 16: 2 x 2 means, VGG-11's last pool dropped
    per_class: int        # training images per class (CIFAR-10-2k: 200)
    test_size: int        # the first images of test_batch
    lr: float
    wd: float
    steps: int
    init_norm: float | None  # ||w0|| (None: He initialisation's own); the initial effective
    #                          LR is lr / ((1 - lr wd) ||w0||^2)
    sharpness_every: int
    evals: int            # theta snapshots at which train and test accuracy are measured
    dtype: str = "float32"
    seed: int = 0
    arch: tuple | None = None   # channels and "M" (pools); None: VGG-11 for ``image``
    net: str = "vgg11"          # or "resnet20": the paper's scale-invariant ResNet-20 (ReLU)


#: The paper's setting (CIFAR-10-2k, full VGG-11): lambda = 5e-4 is the paper's; lr and the
#: step count are this entry's (the text extract in shared/papers gives neither).
FULL = Setting(width=1.0, image=32, per_class=200, test_size=10_000, lr=0.8, wd=5e-4,
               steps=20_000, init_norm=None, sharpness_every=200, evals=100)
#: 2 CPU cores, minutes: width / 16, 16 x 16 images, 20 images per class, fewer steps.
DEFAULT = Setting(width=1 / 16, image=16, per_class=20, test_size=1000, lr=0.8, wd=5e-3,
                  steps=1500, init_norm=400.0, sharpness_every=50, evals=50)
#: Seconds: a smoke run.
QUICK = Setting(width=1 / 32, image=16, per_class=5, test_size=200, lr=0.8, wd=5e-3,
                steps=200, init_norm=400.0, sharpness_every=20, evals=20)
#: Scale-invariant ResNet-20 (the paper's Appendix P.2), the same data and runs:
#: ``pysharp reproduce cifar-sharpness --net resnet20`` (``run(..., net="resnet20")``).
RESNET20_FULL = replace(FULL, net="resnet20")
RESNET20_DEFAULT = replace(DEFAULT, net="resnet20", width=1 / 4)
RESNET20_QUICK = replace(QUICK, net="resnet20", width=1 / 8)
#: The experiment's options beyond --quick, --full and --data (``reproduce.run``'s
#: ``options``), each with its choices, the default first.
OPTIONS = {"net": ("vgg11", "resnet20")}


# -- the network, in plain JAX -------------------------------------------------------------
RESNET_STAGES = (16, 32, 64)


def layers(s: Setting) -> tuple:
    """The network's layers, channels (times the width) and "M" for a 2 x 2 max pool: VGG-11
    for ``s.image`` x ``s.image`` inputs (32 keeps all five pools, 16 drops the last, so the
    features end 1 x 1 either way), or ``s.arch``."""
    if s.net != "vgg11":
        raise ValueError(f"layers() describes VGG-style nets, not {s.net!r}")
    arch = s.arch
    if arch is None:
        if s.image not in (16, 32):
            raise ValueError(f"image must be 32 or 16, got {s.image}")
        arch = VGG11 if s.image == 32 else VGG11[:-1]
    return tuple(c if c == "M" else max(1, int(round(c * s.width))) for c in arch)


def plan(s: Setting) -> str:
    """The layers as the loss's static argument: "C" a convolution, "M" a pool; "resnet20"."""
    if s.net == "resnet20":
        return "resnet20"
    if s.net != "vgg11":
        raise ValueError(f"net must be 'vgg11' or 'resnet20', got {s.net!r}")
    return "".join("M" if c == "M" else "C" for c in layers(s))


def init_params(s: Setting, classes: int = 10) -> dict:
    """He-normal filters ``conv0``, ``conv1``, ... (out, in, 3, 3) and the last layer ``fc``
    (classes, features), float64 NumPy. Their scales matter only through the initial norm."""
    rng = np.random.default_rng(s.seed)
    if s.net == "resnet20":
        return _resnet_params(s, rng, classes)
    params, cin = {}, 3
    for i, c in enumerate(c for c in layers(s) if c != "M"):
        params[f"conv{i}"] = rng.standard_normal((c, cin, 3, 3)) * np.sqrt(2 / (9 * cin))
        cin = c
    side = s.image // 2 ** plan(s).count("M")
    params["fc"] = rng.standard_normal((classes, cin * side * side)) / np.sqrt(cin * side ** 2)
    return params


def _bn(z, ref, axes):
    """z normalised with the mean and standard deviation of ``ref`` over ``axes`` (no eps,
    no affine parameters: scale-invariant)."""
    import jax.numpy as jnp  # lazy: JAX is optional, imported when the network is traced

    mean = ref.mean(axis=axes, keepdims=True)
    sd = jnp.sqrt(((ref - mean) ** 2).mean(axis=axes, keepdims=True))
    return (z - mean) / sd


def _he(rng, cout: int, cin: int, k: int) -> np.ndarray:
    return rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (k * k * cin))


def _resnet_params(s: Setting, rng, classes: int) -> dict:
    """ResNet-20's filters: ``stem``; per stage i and block j ``s{i}b{j}c1``, ``s{i}b{j}c2``
    and, where the block changes the shape, the 1 x 1 shortcut ``s{i}b{j}sc``; ``fc``."""
    widths = [max(1, int(round(c * s.width))) for c in RESNET_STAGES]
    params, cin = {"stem": _he(rng, widths[0], 3, 3)}, widths[0]
    for i, c in enumerate(widths):
        for j in range(3):
            params[f"s{i}b{j}c1"] = _he(rng, c, cin, 3)
            params[f"s{i}b{j}c2"] = _he(rng, c, c, 3)
            if (i > 0 and j == 0) or cin != c:
                params[f"s{i}b{j}sc"] = _he(rng, c, cin, 1)
            cin = c
    params["fc"] = rng.standard_normal((classes, cin)) / np.sqrt(cin)
    return params


def _resnet_logits(params, h, r):
    """Scale-invariant ResNet-20 (the paper's Appendix Q.1): every convolution (3 x 3, and the
    1 x 1 shortcuts where a block halves the image or changes the width) followed by BN
    without affine parameters, ReLU, three stages of three basic blocks, global average
    pooling, the BN'd logits. ``r`` is None (BN with ``h``'s own statistics) or the
    reference batch passed side by side."""
    import jax  # lazy: JAX is optional, imported when the network is traced

    same = r is None

    def conv(pair, f, stride):
        def c(a):
            return jax.lax.conv_general_dilated(a, f, (stride, stride), "SAME",
                                                dimension_numbers=("NCHW", "OIHW", "NCHW"))
        zh = c(pair[0])
        zr = zh if same else c(pair[1])
        return _bn(zh, zr, (0, 2, 3)), None if same else _bn(zr, zr, (0, 2, 3))

    def relu(pair):
        return tuple(None if a is None else jax.nn.relu(a) for a in pair)

    x = relu(conv((h, r), params["stem"], 1))
    for i in range(len(RESNET_STAGES)):
        for j in range(3):
            stride = 2 if i > 0 and j == 0 else 1
            y = conv(relu(conv(x, params[f"s{i}b{j}c1"], stride)), params[f"s{i}b{j}c2"], 1)
            sc = conv(x, params[f"s{i}b{j}sc"], stride) if f"s{i}b{j}sc" in params else x
            x = relu((y[0] + sc[0], None if same else y[1] + sc[1]))
    fc = params["fc"]
    zh = x[0].mean(axis=(2, 3)) @ fc.T
    zr = zh if same else x[1].mean(axis=(2, 3)) @ fc.T
    return LOGIT_SCALE * _bn(zh, zr, (0,))


def logits(params, X, X_ref=None, *, plan: str):
    """The network's logits on ``X`` (n, 3, side, side), every BN with the batch statistics
    of ``X_ref`` (default ``X`` itself: full-batch BN in training; the training set's for test
    accuracy). Both pass through the network side by side. ``plan``: "C" a convolution with
    BN and Swish, "M" a 2 x 2 max pool, in order."""
    import jax  # lazy: JAX is optional, imported when the network is traced
    import jax.numpy as jnp

    same = X_ref is None
    real = params["fc"].dtype        # the precision of w: the data follow it
    h = jnp.asarray(X, real)
    r = h if same else jnp.asarray(X_ref, real)
    if plan == "resnet20":
        return _resnet_logits(params, h, None if same else r)
    i = 0
    for c in plan:
        if c == "M":
            pool = partial_pool(jax, jnp)
            h = pool(h)
            r = h if same else pool(r)
            continue
        conv = lambda a, f=params[f"conv{i}"]: jax.lax.conv_general_dilated(  # noqa: E731
            a, f, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        zh = conv(h)
        zr = zh if same else conv(r)
        h = jax.nn.silu(_bn(zh, zr, (0, 2, 3)))
        r = h if same else jax.nn.silu(_bn(zr, zr, (0, 2, 3)))
        i += 1
    fc = params["fc"]
    zh = h.reshape(h.shape[0], -1) @ fc.T
    zr = zh if same else r.reshape(r.shape[0], -1) @ fc.T
    return LOGIT_SCALE * _bn(zh, zr, (0,))


def partial_pool(jax, jnp):
    """2 x 2 max pooling of NCHW arrays."""
    def pool(a):
        return jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2),
                                     "VALID")
    return pool


def cross_entropy(params, X, y, *, plan: str):
    """Mean cross-entropy of integer labels ``y`` (n,) over the full batch ``X``."""
    import jax  # lazy: JAX is optional, imported when the network is traced
    import jax.numpy as jnp

    z = logits(params, X, plan=plan)
    return jnp.mean(jax.nn.logsumexp(z, axis=1) -
                    jnp.take_along_axis(z, y[:, None], axis=1)[:, 0])


def prepare(images: np.ndarray, mean: np.ndarray, sd: np.ndarray, image: int) -> np.ndarray:
    """uint8 (n, 3, 32, 32) -> float (n, 3, image, image): pixels / 255 standardised per
    channel with the training set's ``mean`` and ``sd``; 16 x 16 by means of 2 x 2 blocks."""
    x = images.astype(np.float64) / 255.0
    if image == 16:
        x = x.reshape(len(x), 3, 16, 2, 16, 2).mean(axis=(3, 5))
    return (x - mean[:, None, None]) / sd[:, None, None]


def accuracy(model, thetas: np.ndarray, X_ref, X, y, plan: str, dtype) -> np.ndarray:
    """Fraction of ``X`` classified as ``y`` at each of ``thetas`` (K, D), BN with the batch
    statistics of ``X_ref`` (the training set), (K,)."""
    import jax  # lazy: JAX is optional, imported when the accuracy is measured
    import jax.numpy as jnp

    predict = jax.jit(lambda w, Xr, Xe: jnp.argmax(
        logits(model.unravel(w), Xe, Xr, plan=plan), axis=1))
    Xr, Xe = jnp.asarray(X_ref, dtype), jnp.asarray(X, dtype)
    return np.array([float(np.mean(np.asarray(predict(jnp.asarray(t, dtype), Xr, Xe)) == y))
                     for t in thetas])


# -- the experiment --------------------------------------------------------------------------
def setting_for(quick: bool, full: bool, net: str = "vgg11") -> Setting:
    """The size (``--quick``, the default, ``--full``) of network ``net`` ("vgg11" or
    "resnet20")."""
    if quick and full:
        raise ValueError("--quick and --full exclude each other")
    if net not in OPTIONS["net"]:
        raise ValueError(f"--net must be one of {', '.join(OPTIONS['net'])}, got {net!r}")
    if net == "resnet20":
        return RESNET20_QUICK if quick else RESNET20_FULL if full else RESNET20_DEFAULT
    return QUICK if quick else FULL if full else DEFAULT


def _shrinkage(s: Setting) -> list[str]:
    """How ``s`` departs from the paper's setting, in words (empty for FULL)."""
    out = []
    if s.net == "resnet20":
        if s.width != 1:
            out.append(f"width x {s.width:g} (stage channels {channels(s)})")
    elif s.arch is not None:
        out.append(f"not VGG-11: layers {list(layers(s))}")
    elif s.width != 1:
        out.append(f"width x {s.width:g} (channels {channels(s)})")
    if s.image != 32:
        pool = "" if s.net == "resnet20" else "; VGG-11's last pool dropped"
        out.append(f"images {s.image} x {s.image} (2 x 2 means{pool})")
    if s.per_class != 200:
        out.append(f"{s.per_class} training images per class, not 200")
    if s.test_size != 10_000:
        out.append(f"the first {s.test_size} test images, not 10 000")
    if s.steps != FULL.steps:
        out.append(f"{s.steps} steps, not {FULL.steps}")
    if s.wd != FULL.wd:
        out.append(f"wd {s.wd:g}, not {FULL.wd:g} (lr x wd {s.lr * s.wd:g}: EoS in fewer "
                   "steps)")
    return out


def channels(s: Setting) -> list[int]:
    if s.net == "resnet20":
        return [max(1, int(round(c * s.width))) for c in RESNET_STAGES]
    return [c for c in layers(s) if c != "M"]


def run(out, quick: bool, *, data=None, full: bool = False, net: str = "vgg11",
        setting: Setting | None = None) -> dict:
    """Train and measure; write ``cifar-sharpness.png``; return the numbers.

    Parameters
    ----------
    data : path
        The folder holding CIFAR-10's python batches (``--data``).
    full : bool
        The paper's setting (a GPU's work) instead of the 2-core default.
    net : {"vgg11", "resnet20"}
        The network (``--net``): the paper's scale-invariant VGG-11 or ResNet-20.
    setting : Setting, optional
        Overrides the size and the network (tests).

    Raises
    ------
    pysharp.reproduce._datasets.DataNotFound
        No ``data``, or no CIFAR-10 batches in it: the message says what to download.
    """

    if data is None:
        raise DataNotFound(f"`pysharp reproduce cifar-sharpness` needs --data DIR. "
                           f"{how_to_get(DATASET)}")
    s = setting or setting_for(quick, full, net)
    split, notes = load_cifar10(data, per_class=s.per_class, test_size=s.test_size)
    n_train, n_test = len(split.y_train), len(split.y_test)
    pixels = split.X_train.astype(np.float64) / 255.0
    if s.image == 16:
        pixels = pixels.reshape(n_train, 3, 16, 2, 16, 2).mean(axis=(3, 5))
    mean, sd = pixels.mean(axis=(0, 2, 3)), pixels.std(axis=(0, 2, 3))
    X_train = prepare(split.X_train, mean, sd, s.image).astype(s.dtype)
    X_test = prepare(split.X_test, mean, sd, s.image).astype(s.dtype)

    model = from_jax(cross_entropy, init_params(s), groups="leaves", X=X_train, y=split.y_train,
                     plan=plan(s))
    w0 = model.initial_point()
    if s.init_norm is not None:   # a stable start: eff. LR x sharpness well below 2
        w0 *= s.init_norm / np.linalg.norm(w0)
    theta_every = max(1, s.steps // s.evals)
    tr = run_gd_wd(model, w0.astype(s.dtype), s.lr, s.wd, s.steps, record_every=theta_every,
                   sharpness_every=s.sharpness_every, theta_every=theta_every,
                   dtype=np.dtype(s.dtype), lanczos_tol=1e-5 if s.dtype == "float32" else 1e-8)
    train_acc = accuracy(model, tr.theta, X_train, X_train, split.y_train, plan(s), s.dtype)
    test_acc = accuracy(model, tr.theta, X_train, X_test, split.y_test, plan(s), s.dtype)
    return _report(out, s, model, tr, train_acc, test_acc, notes, n_train, n_test, split)


def numbers_floor(tr) -> float:
    """The EoS band's floor, 2 (1 - eos_tol): where the engine sees the edge reached."""
    return 2 * (1 - tr.eos_tol)


def _report(out, s, model, tr, train_acc, test_acc, notes, n_train, n_test, split) -> dict:
    entry = int(tr.eos_entry_step)
    entered = entry >= 0
    ratio, sharp = np.asarray(tr.eos_ratio), np.asarray(tr.sharpness)
    after = ratio[tr.sharpness_steps >= entry] if entered else np.array([])
    s_entry = float(sharp[tr.sharpness_steps >= entry][0]) if entered else None
    fit = np.flatnonzero(train_acc >= 1.0)
    shrink = _shrinkage(s) + notes
    numbers = {
        "eos_entered": entered, "eos_entry_step": entry,
        "eos_ratio_start": float(ratio[0]),
        "eos_band": [2 * (1 - tr.eos_tol), 2 * (1 + tr.eos_tol)],
        "eos_ratio_median_after_entry": float(np.median(after)) if entered else None,
        "eos_ratio_fraction_in_band": float(np.mean(np.abs(after - 2) <= 2 * tr.eos_tol))
        if entered else None,
        "sharpness_start": float(sharp[0]), "sharpness_max": float(np.nanmax(sharp)),
        "sharpness_at_entry": s_entry, "sharpness_end": float(sharp[-1]),
        "sharpness_fell_after_entry": bool(sharp[-1] < s_entry) if entered else None,
        "sharpness_all_converged": bool(np.all(tr.sharpness_converged)),
        "train_loss_start": float(tr.loss[0]), "train_loss_end": float(tr.loss[-1]),
        "train_accuracy_end": float(train_acc[-1]),
        "train_fitted_step": int(tr.theta_steps[fit[0]]) if len(fit) else -1,
        "test_accuracy_start": float(test_acc[0]), "test_accuracy_end": float(test_acc[-1]),
        "test_accuracy_max": float(test_acc.max()),
        "test_accuracy_at_fit": float(test_acc[fit[0]]) if len(fit) else None,
        # the last snapshot before entry: what the stable phase after the fit reached
        "test_accuracy_before_entry": float(test_acc[tr.theta_steps < entry][-1])
        if entered and np.any(tr.theta_steps < entry) else None,
        # upward crossings of the band's floor by eff. LR x sharpness: one for a run that
        # enters and stays, several for entries, destabilisations and re-entries
        "eos_crossings": int(np.sum((ratio[1:] >= numbers_floor(tr)) &
                                    (ratio[:-1] < numbers_floor(tr)))) +
        int(ratio[0] >= numbers_floor(tr)),
        "train_loss_max_after_entry": float(np.max(tr.loss[tr.steps >= entry]))
        if entered else None,
        "diverged": bool(tr.diverged),
        "invariance_rel_change": float(model.invariance.get("rel_change", np.nan)),
    }
    net = ("ResNet-20 (ReLU)" if s.net == "resnet20" else "VGG-11" if s.arch is None
           else f"VGG-style net {list(layers(s))}")
    settings = {"model": f"scale-invariant {net} (BN after every conv, BN'd logits) in JAX "
                         f"(XLA), width x {s.width:g}, D {model.dim}",
                "data": f"CIFAR-10, {n_train} train ({n_train // 10} per class) / {n_test} "
                        f"test, {s.image} x {s.image}",
                "lr": s.lr, "wd": s.wd, "steps": s.steps,
                "init": f"||w0|| = {s.init_norm:g}" if s.init_norm else "He initialisation",
                "sharpness every": s.sharpness_every, "precision": s.dtype}
    paper = "paper's setting" if not shrink else "SHRUNK: " + "; ".join(shrink)

    fig, ax = subplots(2, 2, figsize=(12, 8.5))
    ax = ax.ravel()
    ax[0].plot(tr.theta_steps, train_acc, label=f"train ({n_train})")
    ax[0].plot(tr.theta_steps, test_acc, label=f"test ({n_test})")
    ax[0].set(xlabel="step", ylabel="accuracy", title="train and test accuracy", ylim=(0, 1.02))
    ax[1].plot(tr.sharpness_steps, sharp, ".-", lw=0.8, ms=3)
    ax[1].set(xlabel="step", ylabel="spherical sharpness lambda_1(H(theta))",
              title="spherical sharpness", yscale="log")
    ax[2].plot(tr.sharpness_steps, ratio, ".-", lw=0.8, ms=3, label="eff. LR x sharpness")
    ax[2].axhspan(*numbers["eos_band"], color="0.85", label="EoS band 2 (1 +- eos_tol)")
    ax[2].axhline(2, color="k", lw=0.8)
    ax[2].set(xlabel="step", ylabel="eff. LR x spherical sharpness",
              title="eff. LR x sharpness (the edge at 2)", yscale="log")
    ax[3].semilogy(tr.steps, tr.loss, lw=0.8, label="training loss")
    ax[3].semilogy(tr.steps, tr.eff_lr, lw=0.8, label="effective LR")
    ax[3].set(xlabel="step", ylabel="training loss; effective LR",
              title="training loss (cross-entropy) and effective LR")
    for panel in ax:
        if entered:
            panel.axvline(entry, color="C3", ls=":", lw=0.8, label=f"EoS entry (step {entry})")
        if panel.get_legend_handles_labels()[0]:
            panel.legend(fontsize=8)
    footer(fig, paper, bool(shrink))
    figure = save(fig, out, "cifar-sharpness", f"CIFAR-10-2k, scale-invariant {net}, "
                  "full-batch GD+WD (Lyu et al. Fig. 2)", settings)
    return {"figures": [figure], "settings": settings, "setting": asdict(s),
            "paper_setting": not shrink, "shrinkage": shrink, "data_source": split.source,
            "data_files": split.files, "n_train": n_train, "n_test": n_test,
            "dim": model.dim, "channels": channels(s), "logit_scale": LOGIT_SCALE, **numbers}


__all__ = ["run", "Setting", "FULL", "DEFAULT", "QUICK", "RESNET20_FULL", "RESNET20_DEFAULT",
           "RESNET20_QUICK", "OPTIONS", "cross_entropy", "logits", "init_params"]
