"""Every `pysharp reproduce` experiment runs (quick) and reports the predicted effects."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def results():
    """The quick runs of every experiment, shared with test_figures.py (run once)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from test_figures import quick_all
    finally:
        sys.path.pop(0)
    out, res, _ = quick_all()
    return out, res


def test_all_experiments_write_figures_and_numbers(results):
    out, res = results
    # an experiment whose optional packages are missing is skipped (digits: JAX, scikit-learn)
    assert set(res) == {name for name in reproduce.names() if reproduce.missing(name) is None}
    for name, summary in res.items():
        for fig in summary["figures"]:
            assert (out / fig).stat().st_size > 10_000
        assert json.loads((out / f"{name}.json").read_text())["quick"] is True
    assert "## tracking" in (out / "index.md").read_text()


def test_experiment_numbers_show_the_theory(results):
    """Quick runs; each bound is the theory's with about a factor 2 over what is measured.

    Quantities measured after EoS entry differ by up to ~10 % between machines (the
    period-two dynamics amplify rounding), which the margins leave room for.
    """
    _, res = results
    per = res["bn-linreg-periodic"]
    assert per["sign_flip_fraction_last_60_steps"] >= 59 / 60            # period two: 1.0
    assert abs(per["eos_ratio_median_after_entry"] - 2) < 0.02          # 1.989
    assert per["eos_ratio_fraction_in_band"] >= 0.95                      # 1.0
    mn = res["bn-linreg-minnorm"]
    assert abs(mn["cosine_gd_wd"] - mn["cosine_flow"]) < 1e-3  # 1e-4: GD+WD tracks the flow
    assert 1 - mn["cosine_gd_wd"] < 0.05 * (1 - mn["cosine_gd_no_wd"])   # 0.0033 vs 0.18
    mc = res["matrix-completion"]
    assert mc["sharpness_end"] < 0.5 * mc["sharpness_at_entry"]          # 17.3 vs 45.7
    assert mc["test_loss_end"] < 0.5 * mc["test_loss_at_entry"]          # 0.48 vs 1.31
    assert mc["sigma3_over_sigma2_end"] < 0.75 * mc["sigma3_over_sigma2_at_entry"]  # 0.36 vs 0.60
    tr = res["tracking"]
    assert tr["fitted_slope"] >= 0.25 and all(np.diff(tr["max_error"]) < 0)
    toy = res["toy3d"]
    # phi moves 0.136 along Gamma; GD+WD ends 0.003 from the flow (2 %): 5 % of the drift
    drift = toy["phi_start"] - toy["phi_end_flow"]
    assert drift > 0.1
    assert abs(toy["phi_end_gd"] - toy["phi_end_flow"]) < 0.05 * drift
    # eff. LR x sharpness at every step: its 1000-step mean stays within 1 % of 2 (1.993-2.009)
    assert toy["eos_ratio_mean_window"] == 1000
    assert all(abs(r - 2) < 0.02 for r in toy["eos_ratio_mean_range"])
    # records fine enough for curves; the entry refined to them; the panels plot the JSON's run
    assert mc["record_every"] <= 50 and mc["singular_value_panel"] == "20 x 20"
    assert mc["eos_entry_step"] <= mc["eos_entry_step_engine"]
    ab = res["ablation"]
    assert ab["mc_test_loss_end_wd_0.001"] < 0.5 * ab["mc_test_loss_end_wd_0"]
    # without WD there is no EoS: the sharpness stays where GD landed (45.7 both)
    assert ab["mc_sharpness_end_wd_0"] == pytest.approx(mc["sharpness_at_entry"], rel=1e-2)
    sgd = res["sgd-stability"]
    assert sgd["interpolated"] == sgd["runs"] == 8 and not sgd["not_interpolated"]
    assert sgd["all_linearly_stable"] and sgd["max_lr_over_critical_lr"] < 1
    assert sgd["max_moment_ratio_k2"] <= 1 and sgd["max_moment_ratio_k3"] <= 1
    assert sgd["all_multiplicative_inequalities_hold"]
    assert sgd["g_W_large_lr_batch_1"] < sgd["g_W_small_lr_full_batch"]
    assert sgd["g_x_large_lr_batch_1"] < sgd["g_x_small_lr_full_batch"]
    # the almost-sure exponent: < 0 at every minimum found, never above log(rho(T_2)) / 2
    assert sgd["all_converge_almost_surely"] and sgd["max_lyapunov"] < 0
    for row in sgd["table"]:
        assert row["lyapunov"] <= row["half_log_rho_T2"] + 4 * row["lyapunov_stderr"] + 1e-6
    p2 = res["period-two"]
    assert p2["sign_alternation_min"] >= 0.95 and p2["drift_cosine_min"] > 0.9  # 1.0, 0.956
    assert p2["entry_ratio"][1] < p2["entry_ratio"][0]            # 1.037 < 1.116: Theorem 4.4


def test_all_entry_mse_is_the_count_weighted_train_and_held_out_loss():
    from pysharp import BNMatrixCompletion
    from pysharp.reproduce.matrix_completion import all_entry_mse

    model = BNMatrixCompletion.synthetic(size=7, true_rank=2, rank=7, seed=3)
    theta = np.stack([model.random_point(seed=s) for s in range(3)])
    n_obs, n_held = len(model.values), len(model.test[2])
    assert n_obs + n_held == 49
    expected = (n_obs * model.loss(theta) + n_held * model.test_loss(theta)) / 49
    np.testing.assert_allclose(all_entry_mse(model, theta), expected, rtol=1e-12)


def test_cli_reproduce_one_and_unknown(tmp_path, capsys):
    assert main(["reproduce", "tracking", "--quick", "--out", str(tmp_path)]) == 0
    assert "fitted_slope" in capsys.readouterr().out
    assert main(["reproduce", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err


# -- README's numbers ------------------------------------------------------------------
TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _readme_numbers():
    if not (TOOLS / "readme_numbers.py").exists():
        pytest.skip("tools/ not next to the tests")
    sys.path.insert(0, str(TOOLS))
    try:
        import readme_numbers
    finally:
        sys.path.remove(str(TOOLS))
    return readme_numbers


def test_readme_numbers_are_those_of_a_default_run(tmp_path):
    """The two cheapest experiments at their default settings against README's rows."""
    tool = _readme_numbers()
    for name in ("tracking", "bn-linreg-periodic"):
        reproduce.run(name, tmp_path, quick=False)
    assert tool.main([str(tmp_path), "--check"]) == 0
    # a stale number and a changed text are both caught
    text = tool.README.read_text()
    summaries = tool._summaries(tmp_path)
    # The slope is measured after EoS entry, where rounding (SIMD width, build)
    # moves it within the tool's tolerance: make the README's own number stale.
    slope = summaries["tracking"]["fitted_slope"]
    stale = re.sub(r"fitted slope [0-9.]+", f"fitted slope {slope * 1.5:.2f}", text)
    assert stale != text and tool.check(stale, summaries)
    assert tool.check(text.replace("(theory ≥ 1/4)", "(theory ≥ 1/3)"), summaries)
    assert not tool.check(tool.update(stale, summaries), summaries)


@pytest.mark.slow
def test_readme_numbers_all_rows(tmp_path):
    tool = _readme_numbers()
    for name in tool.ROWS:
        if reproduce.missing(name) is None:   # else its row is left unchecked
            reproduce.run(name, tmp_path, quick=False)
    assert tool.main([str(tmp_path), "--check"]) == 0


def test_readme_covers_every_experiment_and_its_prose_numbers(results):
    """Every row of README's table has a template; the central flow's accuracy quoted in the
    feature list is checked against (and rewritten from) the same JSON, keeping its wrapping."""
    tool = _readme_numbers()
    assert set(tool.ROWS) == set(reproduce.names())
    _, res = results
    text = tool.README.read_text()
    a, b = tool._table(text)
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", text[a:b], flags=re.M)
    assert sorted(rows) == reproduce.names()
    quick = {"central-flow": res["central-flow"]}     # quick numbers differ from README's
    assert any("loss_avg_rel_err_max_settled" in p for p in tool.check(text, quick))
    rewritten = tool.update(text, quick)
    assert not tool.check(rewritten, quick)
    assert rewritten.count("\n") == text.count("\n")  # numbers replaced in place
    for name, entries in tool.SENTENCES.items():
        for entry in entries:
            tool.render(name, res[name], entry)          # every path exists in the JSON


def test_refined_entry_finds_the_fine_engine_entry_from_coarse_sharpness():
    """The paper's BN linear regression: sharpness every 500 steps and theta every 10, refined
    by bisection, gives the entry the engine finds with sharpness every 10 steps."""
    from pysharp import BNLinearRegression, run_gd_wd
    from pysharp.reproduce._common import refined_entry

    model = BNLinearRegression.synthetic()
    w0 = model.random_point(seed=0, norm=10.0)
    fine = run_gd_wd(model, w0, 0.5, 2e-4, 19_000, record_every=10, sharpness_every=10)
    coarse = run_gd_wd(model, w0, 0.5, 2e-4, 19_000, record_every=10, sharpness_every=500,
                       theta_every=10)
    assert int(coarse.eos_entry_step) - int(fine.eos_entry_step) >= 10  # coarse is late
    assert refined_entry(model, coarse) == int(fine.eos_entry_step)
