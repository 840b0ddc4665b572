"""Every `pysharp reproduce` experiment runs (quick) and reports the predicted effects."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from _reproduce_cases import quick_all  # noqa: E402

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def results():
    """The quick runs of every experiment, shared with test_figures.py (run once)."""
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
    index = (out / "index.md").read_text()
    assert "## tracking" in index
    # the total wall time: all.json has it, index.md and the command state it
    timing = reproduce.timing(out)
    assert set(timing["experiments"]) == set(res) and timing["quick"] is True
    assert timing["seconds"] >= sum(timing["experiments"].values()) - 0.1 * len(res)
    assert reproduce.timing_line(timing) in index
    assert f"Total wall time: {timing['seconds']:.1f} s for {len(res)} experiments" in index


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
    # Fig. 5c-d: the slow cycle after entry, in float64 and float32: its period tends to the
    # small-cycle 2 pi / sqrt(8 lr wd) = 222 (238 after five cycles), its amplitude decays
    # every cycle (4.96, 2.45, 1.45, ... decades of |h|), and it is gone by tau ~ 0.3 in
    # both precisions, while with n = 4 samples it lasts (None: through the run)
    for precision in ("float64", "float32"):
        cyc = per["cycle"][precision]
        assert len(cyc["cycle_periods"]) >= 4, precision
        assert cyc["cycle_periods"][-1] == pytest.approx(per["cycle_period_theory"], rel=0.15)
        assert np.all(np.diff(cyc["cycle_amplitude_decades"]) < 0), precision
        assert cyc["cycle_amplitude_decades"][0] > 1, precision
    assert per["cycle"]["float64"]["h_floor_at_entry"] < per["cycle"]["float32"]["h_floor_at_entry"]
    assert per["h_proxy_rel_err_max"] < 0.05          # 0.023: <v1, grad L> / lambda_1 ~ h_t
    life = {v["variant"]: v["lifetime_tau"] for v in per["cycle_lifetimes"]}
    assert 0.1 < life["paper: float64"] < 1 and 0.1 < life["float32"] < 1    # 0.30, 0.24
    assert life["n = 4"] is None or life["n = 4"] > 3 * life["paper: float64"]
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
    # Figure 4 (Appendix F's setting): the approach leaves a residue ~1e-5 from Gamma, the
    # edge is reached there, the oscillation grows to the period-two orbit of amplitude
    # sqrt(lr wd / 2) (0.1414 vs 0.1414) and z decays as (1 - lr wd)^t once it has settled
    f4 = toy["figure4"]
    assert f4["lr"] == 0.5 and f4["wd"] == 0.08 and f4["w0"] == [0.3, 1.3, 1.2]
    assert f4["loss_at_first_minimiser"] < 1e-6 * f4["loss_start"]          # 7e-11 vs 0.47
    assert 0.5 < f4["z_first_minimiser"] < 0.7                               # 0.636
    assert f4["first_minimiser_step"] <= f4["eos_entry_step"] < f4["oscillation_grown_step"]
    assert f4["h_amplitude_settled"] == pytest.approx(f4["h_amplitude_theory"], rel=0.05)
    assert f4["sign_flip_fraction_settled"] == 1.0
    assert abs(f4["eos_ratio_median_settled"] - 2) < 0.1                     # 1.927
    assert f4["tan_latitude_decay_per_step"] == pytest.approx(
        f4["tan_latitude_decay_gd_exact"], rel=1e-3)                          # 0.0408
    assert f4["z_at_step_200"] < 1e-3 * f4["z_first_minimiser"]              # 3.5e-4
    assert f4["sharpness_end_flow"] == pytest.approx(f4["a"], rel=1e-6)      # a / (1 - 0)
    # Toy3D in the same setting leaves Gamma (|x - y| up to 1.08) with the ratio far from 2
    assert f4["toy3d_same_setting"]["max_abs_x_minus_y_after_200"] > 0.3
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


def test_figure4_loss_against_numpy_and_its_closed_forms():
    """Figure 4's loss, log(1 + a (1 - cos alpha)) compiled from figure4_toy.hpp: loss,
    gradient, H v and D3L against a NumPy reference (complex step and its differences) and
    the identities of scale invariance; the sharpness a / (1 - z^2) on Gamma; the flow's
    closed form tan(latitude) = tan(latitude_0) exp(-tau); and GD+WD's z, untouched by the
    loss, decaying by exactly (1 - lr wd) per step."""
    import pysharp as ps
    from pysharp.flow import SharpnessReductionFlow
    from pysharp.reproduce.toy3d import figure4_toy

    a = 4.0
    model = figure4_toy(a)

    def reference(w):  # analytic in w (no abs, no norm), as the complex step needs
        rho2 = w[0] * w[0] + w[1] * w[1]
        return np.log(1 + a * (1 - (w[0] + w[1]) / np.sqrt(2 * rho2)))

    ps.models.check(model, reference).raise_if_failed()
    lat = np.array([0.0, 0.5, 1.2])
    gamma = np.stack([np.cos(lat) / np.sqrt(2), np.cos(lat) / np.sqrt(2), np.sin(lat)], 1)
    assert np.all(model.loss(gamma * 3.0) == 0)                  # minimal on x = y > 0
    assert model.loss(-gamma[0]) == pytest.approx(np.log(1 + 2 * a))   # x = y < 0: maximal
    sharp = ps.spherical_sharpness(model, gamma).eigenvalues[:, 0]
    np.testing.assert_allclose(sharp, a / np.cos(lat) ** 2, rtol=1e-10)
    sol = SharpnessReductionFlow(model).integrate(gamma[2], 3.0, project_start=False)
    latitude = np.arctan2(sol.zeta[:, 2], (sol.zeta[:, 0] + sol.zeta[:, 1]) / np.sqrt(2))
    np.testing.assert_allclose(np.tan(latitude), np.tan(lat[2]) * np.exp(-sol.tau), rtol=1e-8)
    np.testing.assert_allclose(sol.sharpness, a / np.cos(latitude) ** 2, rtol=1e-10)
    lr, wd = 0.5, 0.08
    tr = ps.run_gd_wd(model, [0.3, 1.3, 1.2], lr, wd, 60, record_every=1, sharpness_every=0,
                      theta_every=1)
    w_z = tr.theta[:, 2] * np.sqrt(tr.norm2)
    np.testing.assert_allclose(w_z, 1.2 * (1 - lr * wd) ** np.arange(61), rtol=1e-12)


@pytest.mark.parametrize("a, settles", [(4.0, True), (0.5, False)])
def test_figure4_period_two_orbit_attracts_only_above_a_1(a, settles):
    """From near the flattest point at the edge (lr wd 1e-3), GD+WD settles on the period-two
    orbit |h| = sqrt(lr wd / 2) for a > 1; for a < 1 its slow cycle grows until the iterate
    lands on Gamma (x - y = 0 exactly, the float64 collapse Toy3D needs jitter against)."""
    import pysharp as ps
    from pysharp.reproduce._common import theory_start
    from pysharp.reproduce.toy3d import figure4_toy

    lr, wd = 0.1, 0.01
    w0 = theory_start(np.array([1, 1, 0]) / np.sqrt(2), a, lr, wd, margin=0.95,
                      perturbation=1e-2)
    tr = ps.run_gd_wd(figure4_toy(a), w0, lr, wd, 20_000, record_every=1, sharpness_every=0,
                      theta_every=1)
    h = np.abs(tr.theta[-2000:, 1] - tr.theta[-2000:, 0]) / np.sqrt(2)
    on_orbit = np.allclose(h, np.sqrt(lr * wd / 2), rtol=0.02)
    assert on_orbit == settles, (h.min(), h.max())


def test_cycle_lifetime_ends_at_the_first_quiet_window():
    """A loss that swings 10x with the small cycle's period until step 5000 (entry at 1000,
    a floor before it), then holds: the cycle ends where the first window of two periods
    (444 steps at lr wd = 1e-4) lies past step 5000; a loss still swinging at the end has no
    lifetime, nor has a run that never enters EoS."""
    from pysharp.reproduce.bn_linreg_periodic import cycle_lifetime

    lr, wd = 0.5, 2e-4
    t = np.arange(12_001)
    swing = 1 + 9 * (np.sin(2 * np.pi * t / 222) > 0)
    loss = np.where(t < 1000, 1e-30, np.where(t < 5000, swing, 1.0))
    life = cycle_lifetime(loss, 1000, lr, wd)
    assert 5000 - 1000 <= life / (lr * wd) < 5000 - 1000 + 44 + 1     # one stride of 44 steps
    assert cycle_lifetime(np.where(t < 1000, 1e-30, swing), 1000, lr, wd) is None
    assert cycle_lifetime(loss, -1, lr, wd) is None


def test_all_entry_mse_is_the_count_weighted_train_and_held_out_loss():
    from pysharp import BNMatrixCompletion
    from pysharp.reproduce.matrix_completion import all_entry_mse

    model = BNMatrixCompletion.synthetic(size=7, true_rank=2, rank=7, seed=3)
    theta = np.stack([model.random_point(seed=s) for s in range(3)])
    n_obs, n_held = len(model.values), len(model.test[2])
    assert n_obs + n_held == 49
    expected = (n_obs * model.loss(theta) + n_held * model.test_loss(theta)) / 49
    np.testing.assert_allclose(all_entry_mse(model, theta), expected, rtol=1e-12)


def test_cli_reproduce_all_ends_with_its_total_wall_time(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reproduce, "REGISTRY", {"tracking": "tracking"})   # one, quick
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    timing = reproduce.timing(tmp_path)
    assert last == reproduce.timing_line(timing)
    assert last.startswith(f"Total wall time: {timing['seconds']:.1f} s for 1 experiment ")
    assert last in (tmp_path / "index.md").read_text()


def test_all_in_two_worker_processes_gives_the_same_numbers(tmp_path, monkeypatch):
    """Two experiments two at a time in spawned workers (one thread each): the JSON numbers
    equal those of a run in this process, bit for bit, and all.json names the workers."""
    monkeypatch.setattr(reproduce, "REGISTRY", {"tracking": "tracking", "spectra": "spectra"})
    here = reproduce.run_all(tmp_path / "here", quick=True)
    there = reproduce.run_all(tmp_path / "there", quick=True, workers=2)
    assert set(here) == set(there) == {"tracking", "spectra"}
    for name in here:
        a = json.loads((tmp_path / "here" / f"{name}.json").read_text())
        b = json.loads((tmp_path / "there" / f"{name}.json").read_text())
        a.pop("seconds"), b.pop("seconds")
        assert a == b, name
    timing = reproduce.timing(tmp_path / "there")
    assert timing["workers"] == 2 and "2 worker processes" in reproduce.timing_line(timing)


def test_toy3d_without_a_compiler_is_skipped_saying_why(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-p47")
    text = reproduce.missing("toy3d")
    assert "C++ compiler" in text and "figure4_toy.hpp" in text
    with pytest.raises(ImportError, match=r"C\+\+ compiler"):
        reproduce.run("toy3d", "unused-folder", quick=True)


def test_cli_reproduce_one_and_unknown(tmp_path, capsys):
    assert main(["reproduce", "tracking", "--quick", "--out", str(tmp_path)]) == 0
    assert "fitted_slope" in capsys.readouterr().out
    assert main(["reproduce", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["reproduce", "tracking", "--workers", "2", "--out", str(tmp_path)]) == 2
    assert "--workers is for `pysharp reproduce all`" in capsys.readouterr().err


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
    for name in ("tracking", "spectra"):        # 0.5 s and 1.2 s on the 2-core Xeon
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
    out, res = results
    text = tool.README.read_text()
    a, b = tool._table(text)
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", text[a:b], flags=re.M)
    assert sorted(rows) == reproduce.names()
    quick = {"central-flow": res["central-flow"]}     # quick numbers differ from README's
    assert any("loss_avg_rel_err_max_settled" in p for p in tool.check(text, quick))
    rewritten = tool.update(text, quick)
    assert not tool.check(rewritten, quick)
    assert rewritten.count("\n") == text.count("\n")  # numbers replaced in place
    summaries = {**res, "all": reproduce.timing(out)}   # "all": the timing record
    for name, entries in tool.SENTENCES.items():
        if name not in summaries:                        # digits without its packages
            assert reproduce.missing(name) is not None, name
            continue
        for entry in entries:
            tool.render(name, summaries[name], entry)    # every path exists in the JSON


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
