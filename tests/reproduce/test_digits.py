"""`pysharp reproduce digits`: a BN network written in JAX on real data, trained by GD+WD.

The quick run (200 training digits, lr 1, wd 1e-3, 3000 steps) takes about 25 s on 2
cores, most of it the first compile of the traced model; the numbers quoted next to the
bounds are those of that run. Without JAX or scikit-learn the experiment is refused with
what to install, and ``run_all`` skips it (checked with a requirement that is never there).
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402
from pysharp.reproduce import digits  # noqa: E402


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    pytest.importorskip("jax")
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("digits")
    return out, reproduce.run("digits", out, quick=True)


def test_quick_run_writes_its_figure_and_numbers(quick):
    out, summary = quick
    assert summary["figures"] == ["digits.png"]
    assert (out / "digits.png").stat().st_size > 10_000
    saved = json.loads((out / "digits.json").read_text())
    assert saved["quick"] is True and saved["eos_entry_step"] == summary["eos_entry_step"]
    assert saved["n_train"] + saved["n_test"] == 1797 and saved["dim"] == 16 * 64


def test_quick_run_enters_eos_holds_the_edge_and_flattens(quick):
    _, s = quick
    assert s["check_passed"] and not s["diverged"] and s["sharpness_all_converged"]
    # Stable start (0.17), then the norm decays until eff. LR x sharpness reaches 2.
    assert s["eos_ratio_start"] < 0.5
    assert s["eos_entered"] and 0 < s["eos_entry_step"] < s["steps"] / 2      # 1200 of 3000
    # The training digits are fitted before entry: loss 3.9 -> 0.010, accuracy 1.
    assert s["train_accuracy_at_entry"] == 1.0
    assert s["train_loss_at_entry"] < 0.01 * s["train_loss_start"]
    # At the edge: the ratio's median within the EoS band 2 (1 +- eos_tol), eos_tol = 0.05
    # (2.048: at lr wd = 1e-3 the period-two oscillation lifts it a few per cent; the
    # overshoot just after entry reaches 2.41), most samples inside the band (76 %).
    assert abs(s["eos_ratio_median_after_entry"] - 2) <= 0.1
    assert s["eos_ratio_fraction_in_band"] >= 0.5
    # Sharpness falls after entry: 1109 -> 199.
    assert s["sharpness_fell"] and s["sharpness_end"] < 0.5 * s["sharpness_at_entry"]
    # Held-out digits: 0.917 against chance 0.503 (the majority class).
    assert s["test_accuracy_end"] > s["test_accuracy_chance"] + 0.3
    assert s["train_accuracy_end"] == 1.0


def test_outputs_are_the_network_of_the_jax_loss():
    """The NumPy evaluation behind the accuracies is the traced loss's network, and the
    prediction does not change when a row of W is scaled (per-row scale invariance)."""
    pytest.importorskip("sklearn")
    jax = pytest.importorskip("jax")
    from pysharp.models._check import _jax_x64

    X_train, odd_train, X_test, odd_test = digits.digits_split(50)
    a = digits.readout()
    y = 1.0 - 2.0 * odd_train
    w = np.random.default_rng(0).standard_normal(digits.HIDDEN * 64)
    out = digits.outputs(w[None], X_train, X_train, a)[0]
    with _jax_x64(jax):       # float64, as from_jax traces it
        loss = float(digits.bn_tanh_loss(*(jax.numpy.asarray(v) for v in (w, X_train, y, a))))
    assert np.mean((out - y) ** 2) == pytest.approx(loss, rel=1e-12)
    scaled = w.reshape(digits.HIDDEN, 64) * np.geomspace(0.1, 10, digits.HIDDEN)[:, None]
    np.testing.assert_allclose(digits.outputs(scaled.reshape(1, -1), X_train, X_test, a)[0],
                               digits.outputs(w[None], X_train, X_test, a)[0], atol=1e-12)
    assert len(X_test) == 1797 - 50 and set(np.unique(odd_test)) == {0, 1}


def test_missing_requirements_are_named_and_skipped(monkeypatch, tmp_path, capsys):
    """Without its packages, `reproduce digits` says what to install; `all` skips it."""
    monkeypatch.setattr(digits, "REQUIRES", {"pysharp_absent_module": "absent-package"})
    message = "`pysharp reproduce digits` needs absent-package: pip install 'pysharp[digits]'"
    assert reproduce.missing("digits") == message
    with pytest.raises(ImportError, match="absent-package"):
        reproduce.run("digits", tmp_path)
    assert main(["reproduce", "digits", "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    monkeypatch.setattr(reproduce, "REGISTRY", {"digits": "digits"})
    assert reproduce.run_all(tmp_path, quick=True) == {}
    assert f"Skipped: {message}." in (tmp_path / "index.md").read_text()
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path)]) == 0
    assert f"skipped digits: {message}" in capsys.readouterr().out
    assert not (tmp_path / "digits.json").exists()


def test_a_run_that_never_enters_reports_none_after_entry():
    steps = np.arange(0, 101, 10)
    tr = SimpleNamespace(eos_ratio=np.linspace(0.1, 1.0, 11), sharpness=np.linspace(9, 10, 11),
                         sharpness_steps=steps, steps=steps, loss=np.ones(11), theta_steps=steps,
                         eos_tol=0.05)
    numbers = digits._at_entry(tr, -1, np.ones(11), np.ones(11))
    assert numbers and all(value is None for value in numbers.values())
    entered = digits._at_entry(tr, 50, np.ones(11), np.ones(11))
    assert entered["eos_ratio_samples"] == 6 and entered["sharpness_at_entry"] == 9.5
