"""The method table (pysharp._engine.methods.METHODS): every layer reads the same rows, and each
row's properties are what the engine and the layers above it actually do."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import pysharp as ps
from pysharp._engine import Method, loader
from pysharp._engine.methods import METHODS, method_spec
from pysharp.dynamics import run_method
from pysharp.sweeps._compute import METHOD_DIMS

ROOT = Path(__file__).resolve().parents[2]
MODEL = ps.BNLinearRegression.synthetic(d=6, n=4, seed=2)
W0 = np.stack([MODEL.random_point(seed=s, norm=3.0) for s in range(2)])


def _tool():
    spec = importlib.util.spec_from_file_location("gen_methods", ROOT / "tools" / "gen_methods.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(name, lr=0.05, wd=1e-3, c=1.0, **kw):
    """Six steps of ``name``; on the sphere its eta is ``lr``."""
    kw = dict(record_every=1, sharpness_every=0, backend="cpp") | kw
    values = {"lr": lr, "wd": wd, "eta": lr, "c": c}
    return run_method(MODEL, W0, {h: values[h] for h in METHODS[name].hyper}, 6, method=name,
                      **kw)


def test_one_table_gives_the_engine_enum_the_core_names_and_the_python_enum():
    codes = {name: m.code for name, m in METHODS.items()}
    assert dict(loader.core().METHODS) == codes
    assert {m.name.lower(): int(m) for m in Method} == codes
    assert _tool().main(["--check"]) == 0, "engine/methods.hpp is stale"
    assert sorted(codes.values()) == list(range(len(codes)))


def test_generator_notices_a_stale_header(tmp_path, monkeypatch):
    tool = _tool()
    stale = tmp_path / "methods.hpp"
    stale.write_text(tool.generate().replace("pgd = 1", "pgd = 7"))
    monkeypatch.setattr(tool, "HEADER", stale)
    assert tool.main(["--check"]) == 1
    assert tool.main([]) == 0 and tool.main(["--check"]) == 0


def test_every_row_reads_only_declared_hyperparameters():
    from pysharp._engine.methods import HYPERPARAMETERS
    for m in METHODS.values():
        assert set(m.hyper) <= set(HYPERPARAMETERS) and len(set(m.hyper)) == len(m.hyper)
        assert m.uses_wd == ("wd" in m.hyper)
        assert m.on_sphere == ("eta" in m.hyper)  # the step size on the sphere is eta


@pytest.mark.parametrize("name", METHODS)
def test_run_method_takes_exactly_the_rows_hyperparameters(name):
    hyper = {h: 0.05 for h in METHODS[name].hyper}
    with pytest.raises(ValueError, match=f"method '{name}' takes the hyperparameters"):
        run_method(MODEL, W0, {**hyper, "momentum": 0.9}, 6, method=name)
    with pytest.raises(ValueError, match="takes the hyperparameters"):
        run_method(MODEL, W0, dict(list(hyper.items())[1:]), 6, method=name)
    with pytest.raises(ValueError, match="takes the hyperparameters"):
        run_method(MODEL, W0, 0.05, 6, method=name)
    first = METHODS[name].hyper[0]
    with pytest.raises(ValueError, match=f"{first} must be > 0"):
        run_method(MODEL, W0, {**hyper, first: -1.0}, 6, method=name)
    tr = run_method(MODEL, W0, hyper, 6, method=name, sharpness_every=0)
    assert set(tr.hyper) == set(hyper) and all(v.shape == (2,) for v in tr.hyper.values())


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown method 'adam'.*gd_wd"):
        method_spec("adam")
    with pytest.raises(ValueError, match="unknown method"):
        Method.named("adam")


@pytest.mark.parametrize("name", METHODS)
def test_on_sphere_rows_stay_on_the_unit_sphere(name):
    norm2 = _run(name).norm2
    assert np.allclose(norm2, 1.0, rtol=0, atol=1e-12) == METHODS[name].on_sphere
    if not METHODS[name].on_sphere:
        np.testing.assert_allclose(norm2[0], 9.0, rtol=1e-12)  # the start's ||w0||^2


@pytest.mark.parametrize("name", METHODS)
def test_uses_wd_rows_refuse_lr_wd_at_least_one(name):
    if METHODS[name].uses_wd:
        with pytest.raises(ValueError, match="lr \\* wd must be < 1"):
            _run(name, lr=2.0, wd=0.6)
    else:
        _run(name, lr=0.05, wd=0.0)


@pytest.mark.parametrize("name", METHODS)
def test_reduced_rows_are_the_ones_with_the_reduced_update(name):
    if METHODS[name].reduced:
        assert _run(name, reduced=True).meta["reduced"]
    else:
        with pytest.raises(ValueError, match="reduced=True needs"):
            _run(name, reduced=True)


@pytest.mark.parametrize("name", METHODS)
def test_numba_rows_are_the_ones_the_port_runs(name):
    if not ps.backends()["numba"]["available"]:
        pytest.skip("numba is not installed")
    if METHODS[name].numba:  # the same numbers as the compiled core's (no EoS in 6 steps)
        np.testing.assert_allclose(_run(name, backend="numba").loss, _run(name).loss,
                                   rtol=1e-12)
    else:
        with pytest.raises(ps.BackendUnavailable, match=f"numba backend has no port .*{name}"):
            _run(name, backend="numba")


def test_swept_rows_are_the_sweeps_methods_and_the_clis_choices():
    swept = {name for name, m in METHODS.items() if m.sweep}
    assert set(METHOD_DIMS) == swept | {"sgd"}
    from pysharp import cli
    with pytest.raises(SystemExit):  # argparse names the choices
        cli.main(["run", "bn_linear_regression", "--method", "pgd_adaptive"])


@pytest.mark.parametrize("name", METHODS)
def test_adaptive_rows_are_those_whose_step_size_lr_wd_and_norm_do_not_give(name):
    tr = _run(name, lr=0.05, wd=1e-3)
    lr, wd = 0.05, 1e-3
    if METHODS[name].on_sphere:
        fixed = np.full_like(tr.eff_lr, lr)
    else:
        fixed = lr / ((1 - lr * wd) * tr.norm2)
    assert np.allclose(tr.eff_lr, fixed, rtol=1e-12, atol=0) != METHODS[name].adaptive_step


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.sweep])
def test_adaptive_rows_need_step_t_recorded_in_a_sweep(name):
    pytest.importorskip("xarray")
    kw = dict(wd=[0.0] if not METHODS[name].uses_wd else [1e-3], seeds=[0], steps=20,
              record_every=7, progress=False)
    if METHODS[name].adaptive_step:
        with pytest.raises(ValueError, match="must divide steps"):
            ps.sweep("bn_linear_regression", lr=[0.05], method=name, **kw)
    else:
        ds = ps.sweep("bn_linear_regression", lr=[0.05], method=name, **kw)
        assert list(ds.step.values) == [0, 7, 14]


@pytest.mark.parametrize("name", METHODS)
def test_central_flow_rows_are_the_ones_it_models(name):
    if METHODS[name].central_flow:
        assert ps.flow.CentralFlow(MODEL, name, lr=0.05, wd=1e-3).method == name
    else:
        with pytest.raises(ValueError, match="method must be one of"):
            ps.flow.CentralFlow(MODEL, name, lr=0.05, wd=1e-3)


def test_the_cli_runs_a_swept_method(tmp_path, capsys):
    pytest.importorskip("xarray")
    from pysharp import cli
    out = tmp_path / "run"
    assert cli.main(["run", "bn_linear_regression", "--method", "pgd", "--lr", "0.05",
                     "--steps", "40", "--out", str(out)]) == 0
    import json
    summary = json.loads((out / "run.json").read_text())
    assert summary["method"] == "pgd"
    assert summary["wd"] == [0.0] and summary["init_norm"] == [1.0]  # pgd's defaults
