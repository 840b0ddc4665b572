"""Figures fit to publish: every panel labelled, every figure titled with its settings.

The reproduce figures are those of the quick runs (``_reproduce_cases.quick_all``, shared
with test_reproduce.py, so the experiments run once per session); the sweep figures come
from a tiny store made here.
"""

from __future__ import annotations

import json
import re
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402

matplotlib.use("Agg")


from _reproduce_cases import Capture, describe, quick_all  # noqa: E402

import pysharp as ps  # noqa: E402
from pysharp.reproduce._common import settings_line  # noqa: E402


def _flat(text: str) -> str:
    return " ".join(text.split())


def _check_labelled(name: str, info: dict) -> None:
    assert info["suptitle"].strip(), f"{name}: no suptitle"
    for i, ax in enumerate(info["axes"]):
        assert ax["xlabel"].strip(), f"{name}, panel {i} ({ax['title']!r}): no x label"
        assert ax["ylabel"].strip(), f"{name}, panel {i} ({ax['title']!r}): no y label"


# -- pysharp reproduce ---------------------------------------------------------------------
def test_every_reproduce_figure_is_labelled_and_carries_its_settings():
    folder, results, figures = quick_all()
    assert set(figures) == {f for s in results.values() for f in s["figures"]}
    for name, summary in results.items():
        settings = summary["settings"]
        assert settings and isinstance(settings, dict), name
        saved = json.loads((folder / f"{name}.json").read_text())
        assert saved["settings"] == json.loads(json.dumps(settings)), name
        for fig in summary["figures"]:
            # one stem per experiment: NAME.json next to NAME.png (or NAME-PART.png)
            assert fig == f"{name}.png" or fig.startswith(f"{name}-"), fig
            assert (folder / fig).exists()
            _check_labelled(fig, figures[fig])
            # a figure of other settings than the experiment's names its own (toy3d-flow.png)
            own = summary.get("figure_settings", {}).get(fig, settings)
            assert json.loads(json.dumps(own)) == saved.get("figure_settings", {}).get(
                fig, saved["settings"]), fig
            assert _flat(settings_line(own)) in _flat(figures[fig]["suptitle"]), fig


def test_models_and_sizes_are_in_the_settings():
    _, results, _ = quick_all()
    for name, summary in results.items():
        text = settings_line(summary["settings"])
        assert re.search(r"BN|Toy3D|Figure4Toy|TwoLayerNet|Matrix", text), (name, text)
        assert "lr" in text, (name, text)


def test_central_flow_figure_states_the_json_numbers():
    """The figure's text and the JSON measure the same thing, to the digit shown."""
    _, results, figures = quick_all()
    s = results["central-flow"]
    titles = " ".join(_flat(ax["title"]) for ax in figures["central-flow.png"]["axes"])
    assert (f"loss {s['loss_avg_rel_err_max_settled']:.1e} "
            f"(order 2: {s['loss_avg_rel_err_max_settled_order2']:.1e})") in titles
    assert (f"||w||^2 {s['norm2_avg_rel_err_max_settled']:.1e} "
            f"(order 2: {s['norm2_avg_rel_err_max_settled_order2']:.1e})") in titles
    assert f"{s['average_window_steps']}-step average vs flow" in titles
    assert s["settled_from_step"] == s["flow_start_step"] + s["settle_steps"]
    assert f"from {s['settle_steps']} steps after the start" in " ".join(
        " ".join(ax["legend"] or []) for ax in figures["central-flow.png"]["axes"])
    # the settled window leaves the start's transient out: smaller than the transient's
    assert s["loss_avg_rel_err_max_settled"] < s["loss_avg_rel_err_max_transient"]


# -- pysharp plot ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """8 lr x 2 wd (9.64e-5, 1e-3) x 2 seeds x 2 init norms of 400 steps: runs that never
    enter EoS, runs that enter before the first sharpness record and runs that enter later."""
    pytest.importorskip("zarr")
    store = tmp_path_factory.mktemp("plot") / "tiny.zarr"
    ps.sweep({"name": "bn_linear_regression", "d": 8, "n": 5, "seed": 0},
             lr=np.geomspace(0.02, 5, 8), wd=[9.64e-5, 1e-3], seeds=[0, 1],
             init_norm=[1.0, 8.0], steps=400, sharpness_every=50, progress=False, store=store)
    return store


def test_readme_plot_command_hue_is_a_colour_bar(tiny_store, tmp_path, capsys):
    """`pysharp plot STORE --x sharpness_step --hue lr --metric sharpness --sel wd=1e-4`."""
    from pysharp.cli import main

    out = tmp_path / "lines.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Capture() as cap:
            assert main(["plot", str(tiny_store), "--x", "sharpness_step", "--hue", "lr",
                         "--metric", "sharpness", "--sel", "wd=1e-4", "--out", str(out)]) == 0
    assert "nearest to 1e-4" in capsys.readouterr().out
    info = cap.figures["lines.png"]
    _check_labelled("lines.png", info)
    (ax,) = info["axes"]
    assert ax["legend"] is None                       # no legend: a colour bar
    assert info["colorbars"] == ["lr"]
    assert ax["title"] == "sharpness at wd = 9.64e-5 (nearest to 1e-4)"
    assert "bn_linear_regression" in info["suptitle"] and "steps 400" in info["suptitle"]


def test_hue_colour_bar_is_log_for_log_spaced_values(tiny_store):
    from matplotlib.colors import LogNorm, Normalize

    ds = ps.open_sweep(tiny_store)
    fig = ps.sweeps.plot(ds, x="sharpness_step", hue="lr", metric="sharpness", sel={"wd": 1e-3})
    (cbar,) = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert isinstance(cbar._colorbar.norm, LogNorm)
    assert fig.axes[0].get_title() == "sharpness at wd = 0.001"   # exactly a grid value
    fig2 = ps.sweeps.plot(ds, x="step", hue="init_norm", metric="loss")
    norm2 = [ax for ax in fig2.axes if ax.get_label() == "<colorbar>"][0]._colorbar.norm
    assert type(norm2) is Normalize                   # 1 and 8: less than a decade
    assert fig2.axes[0].get_yscale() == "log"         # a loss spanning decades


def test_entry_heatmap_tells_never_from_before_the_first_record(tiny_store):
    ds = ps.open_sweep(tiny_store)
    entry = ds.eos_entry_step.values
    assert (entry < 0).any() and (entry == 0).any()   # the store has both cases
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Capture() as cap:
            ps.sweeps.plot(ds, x="lr", y="wd", metric=["eos_entry_step", "sharpness_drop"],
                           out=Path(tempfile.mkdtemp()) / "map.png")
    info = cap.figures["map.png"]
    _check_labelled("map.png", info)
    for ax in info["axes"]:
        legend = " ".join(ax["legend"])
        assert "never entered EoS" in legend
        assert "entered by the first sharpness record (step 50)" in legend


def test_sgd_heatmaps_log_batch_axis_rho_centred_at_one_and_log_loss_colour():
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    ds = ps.sweep({"name": "linear_regression", "d": 4, "n": 8, "seed": 0}, method="sgd",
                  lr=[0.05, 0.2, 0.5, 1.0], batch=[1, 2, 4, 8], seeds=[0], steps=100,
                  progress=False)
    fig = ps.sweeps.plot(ds, x="lr", y="batch", metric=["rho_T2", "final_loss"])
    rho_ax, loss_ax = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert rho_ax.get_yscale() == "log" and loss_ax.get_yscale() == "log"
    rho_norm = rho_ax.collections[0].norm
    assert isinstance(rho_norm, TwoSlopeNorm) and rho_norm.vcenter == 1
    assert isinstance(loss_ax.collections[0].norm, LogNorm)
    assert describe(fig)["suptitle"].startswith("linear_regression(")
