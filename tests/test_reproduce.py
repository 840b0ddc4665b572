"""Every `pysharp reproduce` experiment runs (quick) and reports the predicted effects."""

import json

import pytest

pytest.importorskip("matplotlib")

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    return out, reproduce.run_all(out, quick=True)


def test_all_experiments_write_figures_and_numbers(results):
    out, res = results
    assert set(res) == set(reproduce.names())
    for name, summary in res.items():
        for fig in summary["figures"]:
            assert (out / fig).stat().st_size > 10_000
        assert json.loads((out / f"{name}.json").read_text())["quick"] is True
    assert "## tracking" in (out / "index.md").read_text()


def test_experiment_numbers_show_the_theory(results):
    _, res = results
    assert res["bn-linreg-periodic"]["sign_flip_fraction_last_60_steps"] > 0.95
    assert res["bn-linreg-minnorm"]["cosine_gd_wd"] > res["bn-linreg-minnorm"]["cosine_gd_no_wd"]
    mc = res["matrix-completion"]
    assert mc["sharpness_end"] < mc["sharpness_at_entry"]
    assert mc["sigma3_over_sigma2_end"] < mc["sigma3_over_sigma2_at_entry"]
    assert res["tracking"]["fitted_slope"] >= 0.25
    assert abs(res["toy3d"]["phi_end_gd"] - res["toy3d"]["phi_end_flow"]) < 0.05
    ab = res["ablation"]
    assert ab["mc_test_loss_end_wd_0.001"] < ab["mc_test_loss_end_wd_0"]
    sgd = res["sgd-stability"]
    assert sgd["interpolated"] >= 3
    assert sgd["all_conditions_hold"] and sgd["max_moment_ratio_k1"] <= 1
    assert sgd["all_multiplicative_inequalities_hold"]
    assert sgd["g_W_largest_lr_smallest_batch"] < sgd["g_W_smallest_lr_full_batch"]
    assert sgd["g_x_largest_lr_smallest_batch"] < sgd["g_x_smallest_lr_full_batch"]


def test_cli_reproduce_one_and_unknown(tmp_path, capsys):
    assert main(["reproduce", "tracking", "--quick", "--out", str(tmp_path)]) == 0
    assert "fitted_slope" in capsys.readouterr().out
    assert main(["reproduce", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment" in capsys.readouterr().err
