"""The ``pysharp`` command line: options, messages, exit codes, outputs and figures.

Oracles: the values given on the command line (echoed in JSON and figure titles), the
store's completion markers (for what an interrupted sweep says it saved), and the
experiment registry of ``pysharp.reproduce`` (for ``reproduce --help``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pysharp as ps
from pysharp.cli import main


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(ps.__file__))] + sys.path))


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved: (file name, suptitle, y labels of its visible panels)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def record(fig, path, *args, **kwargs):
        title = fig._suptitle.get_text() if fig._suptitle is not None else ""
        ylabels = [ax.get_ylabel() for ax in fig.axes if ax.get_visible()
                   and ax.get_label() != "<colorbar>"]
        saved.append((os.path.basename(str(path)), title, ylabels))
        return original(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return saved


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"pysharp {ps.__version__}"


def test_help_is_plain_text_and_reproduce_help_lists_the_experiments():
    from pysharp import reproduce

    top = subprocess.run([sys.executable, "-m", "pysharp", "--help"], capture_output=True,
                         text=True, timeout=120, env=_env())
    assert top.returncode == 0 and "demo" in top.stdout and "`" not in top.stdout
    rep = subprocess.run([sys.executable, "-m", "pysharp", "reproduce", "--help"],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert rep.returncode == 0
    listed = re.findall(r"^  (\S+) +\S", rep.stdout.split("experiments:")[1], flags=re.M)
    assert listed == reproduce.names() + ["all"]


def test_a_negative_number_is_read_as_a_value(capsys):
    pytest.importorskip("xarray")
    assert main(["run", "toy3d", "--wd", "-2e-4", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "wd must be >= 0, got -0.0002" in err  # the value reached the check
    assert "expected" not in err and "Traceback" not in err


def test_a_bad_param_is_named_and_exits_2(capsys):
    pytest.importorskip("xarray")
    assert main(["run", "bn_linear_regression", "--param", "d=forty"]) == 2
    err = capsys.readouterr().err
    assert "--param d must be a whole number (default 40), got 'forty'" in err
    assert main(["run", "bn_linear_regression", "--param", "depth=3"]) == 2
    assert "unknown parameter" in capsys.readouterr().err
    assert main(["run", "bn_linear_regression", "--param", "d"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_whole_numbers_accept_integral_floats_and_refuse_fractions(tmp_path, capsys):
    pytest.importorskip("xarray")
    from pysharp.sweeps._config import model_parameters, whole_number

    assert whole_number("1e5", "steps") == 100_000 and whole_number(2e3, "steps") == 2000
    for bad in ("1.5", 1.5, "forty", True, float("inf")):
        with pytest.raises(ValueError, match="steps"):
            whole_number(bad, "steps")
    assert model_parameters("bn_linear_regression", {"d": "1.2e1", "noise": "0.1"}, "--param") \
        == {"d": 12, "noise": 0.1}
    with pytest.raises(SystemExit) as stop:
        main(["run", "toy3d", "--steps", "1.5"])
    assert stop.value.code == 2 and "'1.5' is not a whole number" in capsys.readouterr().err
    assert main(["run", "toy3d", "--lr", "0.1", "--wd", "1e-3", "--steps", "3e2",
                 "--sharpness-every", "1e2", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["steps"] == 300 and run["sharpness_every"] == 100


def test_config_integers_accept_integral_floats(tmp_path):
    from pysharp.sweeps._config import load_config

    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nname = 'bn_linear_regression'\nd = 1.2e1\nn = 8\n"
                   "[grid]\nlr = 0.1\nwd = 1e-3\n[run]\nsteps = 1e5\nrecord_every = 1e3\n")
    kwargs = load_config(cfg)
    assert kwargs["steps"] == 100_000 and isinstance(kwargs["steps"], int)
    assert kwargs["record_every"] == 1000 and kwargs["model"]["d"] == 12
    cfg.write_text("[model]\nname = 'toy3d'\n[grid]\nlr = 0.1\nwd = 1e-3\n[run]\nsteps = 1.5\n")
    with pytest.raises(ValueError, match="run.steps must be a whole number, got 1.5"):
        load_config(cfg)


def test_record_every_beyond_steps_is_refused_by_the_cli(capsys):
    pytest.importorskip("xarray")
    assert main(["run", "toy3d", "--steps", "100", "--record-every", "200"]) == 2
    assert "record_every = 200 is larger than steps = 100" in capsys.readouterr().err


def test_a_store_too_large_for_the_disk_is_refused(tmp_path, capsys, monkeypatch):
    pytest.importorskip("xarray")
    import shutil
    from collections import namedtuple

    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nname = 'toy3d'\n[grid]\nlr = [0.1, 0.2]\nwd = 1e-3\n"
                   "[run]\nsteps = 1000\nrecord_every = 1\n")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 0, 1000))
    assert main(["sweep", str(cfg), "--store", str(tmp_path / "s.zarr")]) == 2
    err = capsys.readouterr().err
    assert re.search(r"need about [\d.]+ KiB on disk .* only 1e\+03 B are free", err), err
    assert not (tmp_path / "s.zarr").exists()


def test_print_sweep_counts_only_computed_trajectories(capsys):
    xr = pytest.importorskip("xarray")
    from pysharp.cli import _print_sweep

    ds = xr.Dataset({"diverged": ("t", np.zeros(6, bool))}, coords={"step": [0, 50, 100]},
                    attrs={"chunks_computed": 0, "chunks_reused": 3,
                           "trajectories_computed": 0})
    _print_sweep(ds, 0.5)
    out = capsys.readouterr().out
    assert "all 3 chunks reused from the store; nothing computed" in out and "nan" not in out
    ds.attrs.update(chunks_computed=1, chunks_reused=2, trajectories_computed=2)
    s = _print_sweep(ds, 0.5)
    assert s["trajectory_steps_per_s"] == 2 * 100 / 0.5  # not 6 trajectories
    assert "6 trajectories, 2 computed" in capsys.readouterr().out


def test_run_outputs_say_what_they_measure(tmp_path, capsys, figures):
    assert main(["run", "bn_linear_regression", "--param", "d=12", "--param", "n=8",
                 "--lr", "0.5", "1.0", "--wd", "1e-3", "--steps", "2000",
                 "--sharpness-every", "100", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "min_sharpness_after_entry" in out and "sharpness is recorded every 100 steps" in out
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["eos_entry_resolution_steps"] == 100 and run["lr"] == [0.5, 1.0]
    assert run["model_parameters"]["d"] == 12 and run["model_parameters"]["n"] == 8
    ds = ps.sweep({"name": "bn_linear_regression", "d": 12, "n": 8}, lr=[0.5, 1.0], wd=1e-3,
                  init_norm=10.0, steps=2000, sharpness_every=100, progress=False)
    for j, row in enumerate(run["trajectories"]):  # oracle: the sweep's own records
        entry = int(ds.eos_entry_step.values.ravel()[j])
        assert row["eos_entry_step"] == entry
        s = ds.sharpness.values.reshape(2, -1)[j]
        expected = s[ds.sharpness_step.values >= entry].min() if entry >= 0 else None
        assert row["min_sharpness_after_entry"] == pytest.approx(expected)
    (name, title, ylabels), = figures
    assert name == "run.png" and all(ylabels)
    for part in ("d=12", "n=8", "lr 0.5 1", "wd 0.001", "2000 steps", "every 100 steps"):
        assert part in title


def test_demo_quick_writes_its_own_files_and_says_what_it_measures(tmp_path, monkeypatch,
                                                                    capsys, figures):
    pytest.importorskip("zarr")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quick"]) == 0
    out = capsys.readouterr().out
    quick = tmp_path / "pysharp-demo" / "quick"
    assert (quick / "demo.json").exists() and not (tmp_path / "pysharp-demo" / "demo.json").exists()
    m = re.search(r"EoS entry at step (\d+) \(first sharpness record with eff_lr \* sharpness "
                  r">= 1.9 = 2 \(1 - eos_tol\); records every 500 steps", out)
    assert m, out
    summary = json.loads((quick / "demo.json").read_text())
    assert summary["eos_entry_step"] == int(m[1])
    assert {k: summary[k] for k in ("d", "n", "lr", "wd", "steps", "eos_entry_resolution_steps")} \
        == {"d": 40, "n": 20, "lr": 0.5, "wd": 2e-4, "steps": 20_000,
            "eos_entry_resolution_steps": 500}
    assert summary["sweep"]["grid"]["lr"] == {"geomspace": [0.05, 2.0, 12]}
    assert summary["sweep"]["eos_entry_resolution_steps"] == 400
    assert [f[0] for f in figures] == ["demo.png", "demo-sweep.png"]
    for _, title, ylabels in figures:
        assert all(ylabels) and "d = 40, n = 20" in title and "20000 steps" in title
    assert "lr 0.5, wd 0.0002" in figures[0][1]
    assert main(["demo", "--quick"]) == 0  # again: the sweep comes from the store
    out = capsys.readouterr().out
    assert "all 1 chunks reused from the store; nothing computed" in out and "nan" not in out


def test_an_interrupted_demo_says_what_was_saved(tmp_path, monkeypatch, capsys):
    pytest.importorskip("xarray")
    from pysharp.sweeps import SweepInterrupted

    def stop(*args, **kwargs):
        raise SweepInterrupted(3, 16, kwargs["store"])

    monkeypatch.setattr(ps, "sweep", stop)
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert f"3 of 16 chunks saved to {tmp_path}" in err
    assert f"run `pysharp demo --quick --out {tmp_path}`" in err


_SLOW_SWEEP = """
[model]
name = "bn_linear_regression"
[grid]
lr = { geomspace = [0.1, 2.0, 64] }
wd = { geomspace = [1e-4, 1e-3, 4] }
init_norm = 10.0
[run]
steps = 1e5
sharpness_every = 1000
chunk_size = 1
[output]
store = "c.zarr"
"""


def test_ctrl_c_during_a_sweep_says_what_was_saved_and_exits_130(tmp_path):
    """SIGINT once the store has its first chunk: no traceback, no asyncio noise, and the
    count printed is the count of completion markers; the command printed resumes."""
    pytest.importorskip("zarr")
    (tmp_path / "c.toml").write_text(textwrap.dedent(_SLOW_SWEEP))
    proc = subprocess.Popen([sys.executable, "-m", "pysharp", "sweep", "c.toml",
                             "--no-progress"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = tmp_path / "c.zarr" / "_pysharp_done"
    deadline = time.monotonic() + 60
    while not (done.is_dir() and any(p.stem.isdigit() for p in done.glob("*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Task was destroyed" not in err, err
    m = re.search(r"interrupted: (\d+) of 256 chunks saved to c.zarr; run "
                  r"`pysharp sweep c.toml --no-progress --resume`", err)
    assert m, err
    saved = int(m[1])
    assert saved == sum(p.stem.isdigit() for p in done.glob("*.json")) and 1 <= saved < 256


def test_run_without_sharpness_records_is_refused_before_any_work(capsys):
    assert main(["run", "toy3d", "--sharpness-every", "0"]) == 2
    assert "--sharpness-every must be >= 1" in capsys.readouterr().err
