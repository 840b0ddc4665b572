"""`pysharp reproduce cifar-sharpness`: Lyu et al.'s scale-invariant VGG-11 on CIFAR-10-2k.

The tests write CIFAR-10's python batch files with a few images in tmp_path. The end-to-end
run uses a one-convolution network of the same construction (BN after every conv, BN'd
logits); even so it took 20-83 s on the shared 2-core Xeon (load 6 to 8), nearly all of it
XLA compiling the engine's programs (value-and-grad loop, measured step, Lanczos), so it is a
slow test, as is the real VGG-11 at the --quick size through the command line (60-75 s), and
ResNet-20 through ``--net resnet20`` at a tiny size (38 s). The fast tests: the refusal without
data, the loss's invariance, and ``--net`` reaching the experiment (its run replaced).
"""

import json
from dataclasses import replace

import numpy as np
import pytest

pytest.importorskip("matplotlib")
jax = pytest.importorskip("jax")

from _reproduce_cases import write_cifar  # noqa: E402

from pysharp import reproduce  # noqa: E402
from pysharp.cli import main  # noqa: E402
from pysharp.reproduce import cifar_sharpness as cs  # noqa: E402

TINY = cs.Setting(width=1.0, image=16, per_class=3, test_size=10, lr=0.8, wd=5e-3, steps=40,
                  init_norm=20.0, sharpness_every=10, evals=4, arch=(4, "M"))


def test_without_data_it_says_what_to_download_and_exits_2(tmp_path, capsys):
    assert main(["reproduce", "cifar-sharpness", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--data DIR" in err and "cifar-10-python.tar.gz" in err and "cifar-10-batches-py" in err
    assert not list(tmp_path.iterdir())
    # `all` has no data: it skips the experiment and says why
    assert "--data DIR" in reproduce.missing("cifar-sharpness")
    assert reproduce.missing("cifar-sharpness", data=tmp_path) is None
    # the other experiments take neither option; --quick and --full exclude each other
    with pytest.raises(ValueError, match="neither --data nor --full"):
        reproduce.run("tracking", tmp_path, quick=True, data=tmp_path)
    with pytest.raises(ValueError, match="exclude"):
        cs.setting_for(quick=True, full=True)


def test_the_loss_is_scale_invariant_in_every_leaf_and_the_test_pass_uses_train_statistics():
    from pysharp._backends._jax import x64

    s = replace(TINY, arch=(3, "M", 5))
    params = cs.init_params(s)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 3, 16, 16)), np.arange(20) % 10
    Xt = rng.standard_normal((7, 3, 16, 16))
    with x64():
        jp = {k: jax.numpy.asarray(v) for k, v in params.items()}
        loss = float(cs.cross_entropy(jp, X, y, plan=cs.plan(s)))
        scaled = {k: v * (0.1 + i) for i, (k, v) in enumerate(jp.items())}
        assert float(cs.cross_entropy(scaled, X, y, plan=cs.plan(s))) == pytest.approx(
            loss, rel=1e-12)
        # the training set through the side-by-side pass is the training pass itself
        own = cs.logits(jp, X, plan=cs.plan(s))
        np.testing.assert_allclose(cs.logits(jp, X, X, plan=cs.plan(s)), own, atol=1e-12)
        # a test image's logits do not depend on the other test images
        both = cs.logits(jp, Xt, X, plan=cs.plan(s))
        np.testing.assert_allclose(cs.logits(jp, Xt[:1], X, plan=cs.plan(s)), both[:1],
                                   atol=1e-12)
    assert cs.channels(s) == [3, 5] and cs.plan(s) == "CMC"
    assert params["fc"].shape == (10, 5 * 8 * 8)
    vgg = cs.layers(cs.DEFAULT)
    assert cs.plan(cs.DEFAULT) == "CMCMCCMCCMCC" and vgg[0] == 4 and len(vgg) == 12
    assert cs.plan(cs.FULL) == "CMCMCCMCCMCCM" and cs.channels(cs.FULL)[-1] == 512


@pytest.mark.slow   # 20-83 s on the loaded 2-core Xeon, nearly all XLA compiling
def test_tiny_run_end_to_end_writes_its_figure_numbers_and_shrinkage(tmp_path):
    write_cifar(tmp_path / "data", per_batch=(12, 12, 0, 0, 0), n_test=7)
    out = tmp_path / "out"
    out.mkdir()
    summary = cs.run(out, False, data=tmp_path / "data", setting=TINY)
    assert summary["figures"] == ["cifar-sharpness.png"]
    assert (out / "cifar-sharpness.png").stat().st_size > 10_000
    json.dumps(summary, default=float)
    # 3 images per class from 24 training images, all 7 test images: both said
    # write_cifar's labels cycle (3 c) mod 10 over the 24 images: 2 or 3 of each class, so
    # the subset shrinks to 2 per class, and says so
    assert summary["n_train"] == 20 and "2 per class, 20 in all" in " ".join(summary["shrinkage"])
    assert summary["n_test"] == 7 and not summary["paper_setting"]
    shrink = " ".join(summary["shrinkage"])
    assert "not VGG-11" in shrink and "10 test images requested" in shrink
    # the run is the engine's: sharpness measured and finite, accuracies in [0, 1]
    assert summary["sharpness_all_converged"] and np.isfinite(summary["sharpness_end"])
    assert 0 <= summary["test_accuracy_end"] <= 1 and summary["train_accuracy_end"] >= 0.5
    assert summary["invariance_rel_change"] < 1e-5 and not summary["diverged"]
    assert summary["train_loss_end"] < summary["train_loss_start"]
    # the figure's title carries the settings, as every reproduce figure's
    assert "BN after every conv" in summary["settings"]["model"] and summary["settings"]["lr"]


@pytest.mark.slow
def test_cli_quick_vgg11_end_to_end(tmp_path, capsys):
    write_cifar(tmp_path / "data", per_batch=(30, 30, 0, 0, 0), n_test=20)
    assert main(["reproduce", "cifar-sharpness", "--quick", "--data", str(tmp_path / "data"),
                 "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "cifar-sharpness.json").read_text())
    assert saved["quick"] is True and saved["channels"] == [2, 4, 8, 8, 16, 16, 16, 16]
    assert saved["n_train"] == 50 and saved["n_test"] == 20
    assert "cifar-sharpness.png" in capsys.readouterr().out


def test_resnet20_is_scale_invariant_in_every_filter_and_its_test_pass_uses_train_statistics():
    from pysharp._backends._jax import x64

    s = replace(cs.RESNET20_DEFAULT, width=1 / 8)
    params = cs.init_params(s)
    assert cs.plan(s) == "resnet20" and cs.channels(s) == [2, 4, 8]
    # 19 convolutions, the two stage changes' 1 x 1 shortcuts, the last layer
    assert len(params) == 1 + 18 + 2 + 1 and params["s1b0sc"].shape == (4, 2, 1, 1)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((12, 3, 8, 8)), np.arange(12) % 10
    Xt = rng.standard_normal((3, 3, 8, 8))
    with x64():
        jp = {k: jax.numpy.asarray(v) for k, v in params.items()}
        loss = float(cs.cross_entropy(jp, X, y, plan="resnet20"))
        scaled = {k: v * (0.5 + 0.1 * i) for i, (k, v) in enumerate(jp.items())}
        assert float(cs.cross_entropy(scaled, X, y, plan="resnet20")) == pytest.approx(
            loss, rel=1e-12)
        np.testing.assert_allclose(cs.logits(jp, X, X, plan="resnet20"),
                                   cs.logits(jp, X, plan="resnet20"), atol=1e-12)
        both = cs.logits(jp, Xt, X, plan="resnet20")
        np.testing.assert_allclose(cs.logits(jp, Xt[1:2], X, plan="resnet20"), both[1:2],
                                   atol=1e-12)
    assert "stage channels [2, 4, 8]" in " ".join(cs._shrinkage(s))


def test_net_option_reaches_the_experiment_and_is_refused_where_it_does_not_apply(
        tmp_path, capsys, monkeypatch):
    assert cs.setting_for(True, False, "resnet20") is cs.RESNET20_QUICK
    assert cs.setting_for(False, False, "resnet20") is cs.RESNET20_DEFAULT
    assert cs.setting_for(False, True, "resnet20") is cs.RESNET20_FULL
    assert cs.setting_for(True, False) is cs.QUICK and cs.RESNET20_QUICK.net == "resnet20"
    seen = {}

    def fake(out, quick, *, data=None, full=False, net="vgg11", setting=None):
        seen.update(quick=quick, data=data, full=full, net=net)
        return {"figures": []}

    monkeypatch.setattr(cs, "run", fake)
    assert main(["reproduce", "cifar-sharpness", "--quick", "--net", "resnet20", "--data",
                 str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert seen == {"quick": True, "data": str(tmp_path), "full": False, "net": "resnet20"}
    seen.clear()
    assert main(["reproduce", "cifar-sharpness", "--data", str(tmp_path), "--out",
                 str(tmp_path / "out")]) == 0
    assert seen["net"] == "vgg11"  # the module's default: no option passed
    seen.clear()
    capsys.readouterr()
    for argv, message in [
            (["cifar-sharpness", "--net", "lenet", "--data", str(tmp_path)],
             "must be one of vgg11, resnet20"),
            (["tracking", "--quick", "--net", "resnet20"], "takes no --net"),
            (["all", "--quick", "--net", "resnet20"], "--net is for one experiment")]:
        assert main(["reproduce", *argv, "--out", str(tmp_path / "bad")]) == 2, argv
        assert message in capsys.readouterr().err
    assert not seen  # refused before the experiment ran
    assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").iterdir())


@pytest.mark.slow   # ResNet-20's programs (19 convolutions) take XLA about a minute to compile
def test_cli_resnet20_end_to_end_on_a_tiny_setting(tmp_path, capsys, monkeypatch):
    tiny = replace(cs.RESNET20_QUICK, width=1 / 16, per_class=2, test_size=6, steps=6,
                   sharpness_every=3, evals=3)
    monkeypatch.setattr(cs, "RESNET20_QUICK", tiny)
    write_cifar(tmp_path / "data", per_batch=(12, 12, 0, 0, 0), n_test=6)
    assert main(["reproduce", "cifar-sharpness", "--quick", "--net", "resnet20", "--data",
                 str(tmp_path / "data"), "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "cifar-sharpness.json").read_text())
    assert saved["setting"]["net"] == "resnet20" and saved["channels"] == [1, 2, 4]
    assert "ResNet-20" in saved["settings"]["model"] and saved["n_test"] == 6
    assert saved["sharpness_all_converged"] and np.isfinite(saved["sharpness_end"])
    assert saved["invariance_rel_change"] < 1e-5 and not saved["diverged"]
    assert "cifar-sharpness.png" in capsys.readouterr().out
