"""Write (or check) the numbers of README.md's reproduce table from `pysharp reproduce`'s JSON.

    pysharp reproduce all --out figures
    python tools/readme_numbers.py figures            # rewrite the rows in README.md
    python tools/readme_numbers.py figures --check    # exit 1 if README disagrees

Rows live between ``<!-- readme-numbers:begin -->`` and ``<!-- readme-numbers:end -->``;
a row is regenerated only for an experiment with a template here and a JSON file in
the folder, other rows are left as they are (``--check`` checks those experiments only).
Every row of the table has a template. ``SENTENCES`` are numbers quoted in the README's
prose (e.g. the central flow's accuracy in the feature list, and the wall time of
``pysharp reproduce all`` from its ``all.json``): they are found anywhere in the README (line
breaks and indentation allowed between words), checked the same way, and rewritten number
by number, keeping the text's wrapping.

Numbers measured after EoS entry differ between machines (AVX2 and AVX-512 round
differently, and the period-two dynamics amplify it), so ``--check`` compares each
number with a relative tolerance per quantity, measured across machines and across
1e-15 perturbations of the starts; numbers fixed before entry must match as printed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

BEGIN, END = "<!-- readme-numbers:begin -->", "<!-- readme-numbers:end -->"
README = Path(__file__).resolve().parents[1] / "README.md"

# experiment -> (template, {field: (json path, relative tolerance)}). Fields are
# {name:format}; a json path is a key, or keys joined by "." into nested dicts and lists
# (an integer indexes a list: "lr.-1"); a path ending in "%" is shown in per cent.
ROWS: dict[str, tuple[str, dict[str, tuple[str, float]]]] = {
    "toy3d": (
        "Lyu et al.'s Figure 4 in Appendix F's setting (lr 0.5, wd 0.08, w₀ = (0.3, 1.3, 1.2)) on "
        "log(1 + 4(1 − cos α)), minimal on Γ (x = y > 0): loss {l0:.2f} → {l1:.0e} at the "
        "first minimiser (step {rest:d}, z {z0:.2f}), the oscillation grown by step {grown:d}, "
        "then ∣h_t∣ {h:.4f} (√(lr·wd/2) = {hs:.4f}), eff. LR × sharpness {ratio:.2f} and z "
        "{z200:.0e} at step 200 (its latitude's tangent decays {decay:.4f} per step, the flow's "
        "{flow:.3f}); Toy3D (c 10) there leaves Γ (∣x − y∣ up to {gap:.1f} over 16 starts within "
        "1e-15 of w₀). Toy3D from the "
        "edge at lr·wd 1e-4 drifts with the flow: φ {phi_start:.1f} → {phi_end_gd:.1e} (flow: "
        "{phi_end_flow:.1e}), sharpness {sharpness_start:.1f} → {sharpness_end_flow:.1f}",
        # Figure 4's run is 3-D and its orbit attracts: rounding moves its numbers little;
        # Toy3D's excursions in that setting are chaotic: one start's largest gap ranged over
        # 0.25-1.1 (1e-15 nudges, two CPUs), hence the largest of 16 starts and a tolerance
        {"l0": ("figure4.loss_start", 0), "l1": ("figure4.loss_at_first_minimiser", 0.1),
         "rest": ("figure4.first_minimiser_step", 0), "z0": ("figure4.z_first_minimiser", 0),
         "grown": ("figure4.oscillation_grown_step", 0),
         "h": ("figure4.h_amplitude_settled", 1e-3), "hs": ("figure4.h_amplitude_theory", 0),
         "ratio": ("figure4.eos_ratio_median_settled", 0.01),
         "z200": ("figure4.z_at_step_200", 0.1),
         "decay": ("figure4.tan_latitude_decay_per_step", 1e-3),
         "flow": ("figure4.tan_latitude_decay_flow", 0),
         "gap": ("figure4.toy3d_same_setting.max_abs_x_minus_y_after_200", 0.5),
         "phi_start": ("phi_start", 0), "phi_end_gd": ("phi_end_gd", 0.2),
         "phi_end_flow": ("phi_end_flow", 0), "sharpness_start": ("sharpness_start", 0),
         "sharpness_end_flow": ("sharpness_end_flow", 0)}),
    "bn-linreg-periodic": (
        "the paper's setting: EoS entry at step {entry:d}, then eff. LR × sharpness "
        "{median:.3f} (median; {inside:.1f} % of the {samples:d} measurements after entry in "
        "[1.9, 2.1], the transient just after entry spans {lo:.2f}–{hi:.2f}) and a sign flip "
        "of ⟨v₁, ∇L(θ)⟩ in {flips:.0f} % of the last 60 steps; Fig. 5c-d's slow cycle of h_t "
        "and the eff. LR is there after entry: periods {p0:d} → {p1:d} steps (theory "
        "2π/√(8 lr·wd) = {pt:.0f}), ∣h_t∣ swinging {a0:.1f} → {a1:.2f} decades per cycle, gone "
        "by τ = lr·wd (t − entry) = {life:.2f} (float32: {life32:.2f}; with n = 4 samples: "
        "{life4:.1f})",
        # the cycle starts from the rounding floor at entry (1e-18), which differs between
        # machines: its first cycles and its lifetime move more than the settled regime
        {"entry": ("eos_entry_step", 0), "median": ("eos_ratio_median_after_entry", 0.002),
         "inside": ("eos_ratio_fraction_in_band%", 0.02), "samples": ("eos_ratio_samples", 0),
         "lo": ("eos_ratio_min_after_entry", 0.05), "hi": ("eos_ratio_max_after_entry", 0.05),
         "flips": ("sign_flip_fraction_last_60_steps%", 0.05),
         "p0": ("cycle.float64.cycle_periods.0", 0.1),
         "p1": ("cycle.float64.cycle_periods.-1", 0.05),
         "pt": ("cycle_period_theory", 0),
         "a0": ("cycle.float64.cycle_amplitude_decades.0", 0.1),
         "a1": ("cycle.float64.cycle_amplitude_decades.-1", 0.3),
         "life": ("cycle.float64.lifetime_tau", 0.1),
         "life32": ("cycle.float32.lifetime_tau", 0.15),
         "life4": ("cycle_lifetimes.-1.lifetime_tau", 0.2)}),
    "bn-linreg-minnorm": (
        "cosine to the min-norm interpolant: GD+WD {gd:.5f}, the flow 1 − {flow:.0e}, GD "
        "without WD {plain:.3f}",
        {"gd": ("cosine_gd_wd", 1e-5), "flow": ("one_minus_cosine_flow", 1.0),
         "plain": ("cosine_gd_no_wd", 0)}),
    "matrix-completion": (
        "20 x 20: after EoS entry sharpness {s0:.1f} → {s1:.1f}, test loss {t0:.2f} → {t1:.2f}, "
        "σ₃/σ₂ {g0:.2f} → {g1:.2f}; the paper's 50 x 50: all-entry test MSE {m0:.2f} before entry "
        "→ {m1:.4f} (paper: 1.12 → 0.013), sharpness {p0:.1f} → {p1:.1f}",
        # "at entry" is the first sharpness record at or after EoS entry: the period-two
        # oscillation may have begun there, so rounding (SIMD width, build) moves it a little.
        {"s0": ("sharpness_at_entry", 0.02), "s1": ("sharpness_end", 0.1),
         "t0": ("test_loss_at_entry", 0.02), "t1": ("test_loss_end", 0.1),
         "g0": ("sigma3_over_sigma2_at_entry", 0.02), "g1": ("sigma3_over_sigma2_end", 0.1),
         "m0": ("paper_scale.all_entry_mse_before_entry", 0),
         "m1": ("paper_scale.all_entry_mse_end", 0.3),
         "p0": ("paper_scale.sharpness_at_entry", 0.02), "p1": ("paper_scale.sharpness_end", 0.1)}),
    "tracking": (
        "max ‖θ_t − ζ(τ)‖ against lr·wd on a log-log plot: fitted slope {slope:.2f} "
        "(theory ≥ 1/4)",
        # measured after EoS entry: 1e-15 perturbations of the start spread it over 0.36-0.50
        {"slope": ("fitted_slope", 0.35)}),
    "period-two": (
        "Toy3D (c 10) and BN linear regression from the theory's start: h_t = ⟨θ_t − φ_t, v₁⟩ "
        "flips sign in a fraction {flip:.3f} of the steps (the rest lie in jitter-level troughs), "
        "max ∣h_t∣ = {amp:.1f} √(lr·wd); φ_(t+2) − φ_t = −2 h_t² ∇_Γ log λ₁ (cosine {cos:.4f}, "
        "norm ratio {ratio:.4f} at lr·wd 1e-5); Theorem 4.4: eff. LR at the edge / (2/λ₁(θ*)) "
        "{e0:.3f} → {e1:.3f} for lr·wd 1e-3 → 1e-5 (excess ∝ (lr·wd)^{slope:.2f}, theory 1/2)",
        # after-entry quantities vary with rounding (machine, SIMD width); entry ratios less
        {"flip": ("sign_alternation_min", 0.02), "amp": ("amplitude_ratio_max", 0.3),
         "cos": ("toy3d.1e-05.drift_cosine", 0.002),
         "ratio": ("drift_ratio_smallest_lr_wd", 0.002),
         "e0": ("toy3d.1e-03.entry_ratio", 0.01), "e1": ("toy3d.1e-05.entry_ratio", 0.01),
         "slope": ("entry_excess_slope", 0.1)}),
    "ablation": (
        "without WD: sharpness {s0:.1f} and test loss {t0:.2f} stay; with WD: {s1:.1f} and "
        "{t1:.2f}",
        {"s0": ("mc_sharpness_end_wd_0", 0), "t0": ("mc_test_loss_end_wd_0", 0),
         "s1": ("mc_sharpness_end_wd_0.001", 0.1), "t1": ("mc_test_loss_end_wd_0.001", 0.1)}),
    "sgd-stability": (
        "TwoLayerNet (tanh, width {width:d}) trained by SGD on {n:d} points on a circle in R⁸, "
        "lr {lr0:g}–{lr1:g} × batch {b0:d}–{b1:d} × {inits:d} initialisations: {interp:d} of "
        "{runs:d} runs interpolate ({diverged:d} diverge); {stable:d} minima have ρ(T₂) ≤ 1 "
        "(lr / exact critical lr ≤ {crit:.2f} for lr ≤ 1) and {unstable:d} have ρ(T₂) > 1, up "
        "to {rho:.3f}: SGD converged to minima unstable in the second moment, where the "
        "almost-sure Lyapunov exponent of linearised SGD is ≤ {gamma:.1e} per step (< 0); k = 2, 3 "
        "moment-bound ratios ≤ {moment:.1e}; g_W {gw0:.2f} → {gw1:.2f}, g_x {gx0:.2f} → "
        "{gx1:.2f} from (lr 0.1, full batch) to (lr 1, batch 1)",
        # SGD after convergence: the counts are exact, the measured values move with
        # rounding (not yet measured across machines: tolerances are estimates)
        {"width": ("width", 0), "n": ("n", 0), "lr0": ("lr.0", 0), "lr1": ("lr.-1", 0),
         "b0": ("batch.0", 0), "b1": ("batch.-1", 0), "inits": ("initialisations", 0),
         "interp": ("interpolated", 0), "runs": ("runs", 0), "diverged": ("diverged", 0),
         "stable": ("linearly_stable_count", 0), "crit": ("max_lr_over_critical_lr_for_lr_le_1",
                                                          0.02),
         "unstable": ("linearly_unstable_count", 0), "rho": ("max_rho_T2", 0.02),
         "gamma": ("max_lyapunov_second_moment_unstable", 0.05),
         "moment": ("max_moment_ratio", 0.5),
         "gw0": ("g_W_small_lr_full_batch", 0.02), "gw1": ("g_W_large_lr_batch_1", 0.02),
         "gx0": ("g_x_small_lr_full_batch", 0.02), "gx1": ("g_x_large_lr_batch_1", 0.02)}),
    "spectra": (
        "SLQ density (32 probes × 12 steps) along the paper's GD+WD run: the top node equals "
        "the exact sharpness (rel. err {err:.0e}); a null bulk of {null:d}/{dim:d} and n − 2 = "
        "{out:d} outliers, frozen at the interpolating minimum until EoS entry (step {entry:d}), "
        "then shrinking together: sharpness {s0:.2f} → {s1:.2f}",
        # the top node's error is rounding (1e-15): any value up to 4x passes
        {"err": ("slq_top_node_max_rel_err", 3.0), "null": ("null_bulk_at_entry", 0),
         "dim": ("dim", 0), "out": ("outliers_at_entry", 0), "entry": ("eos_entry_step", 0),
         "s0": ("sharpness_at_entry", 0), "s1": ("sharpness_end", 0.01)}),
    "central-flow": (
        "GD+WD on BN linear regression (d {d:d}, n {n:d}), its central flow and the "
        "sharpness-reduction flow on one figure: the flow keeps eff. LR × sharpness at 2 to "
        "{edge:.0e} and predicts GD+WD's {window:d}-step averages of the loss and ‖w‖² to "
        "{loss:.1e} and {norm2:.1e} (order 2: {loss2:.0e} and {norm22:.0e}; max rel. error "
        "from {settle:d} steps after the flow's start; up to {transient:.0e} in the start's "
        "transient before)",
        # measured after EoS entry; the order-2 residuals are 1e-7..1e-5 and move most
        {"d": ("d", 0), "n": ("n", 0), "edge": ("max_edge_error", 5.0),
         "window": ("average_window_steps", 0), "loss": ("loss_avg_rel_err_max_settled", 0.05),
         "norm2": ("norm2_avg_rel_err_max_settled", 0.05),
         "loss2": ("loss_avg_rel_err_max_settled_order2", 0.5),
         "norm22": ("norm2_avg_rel_err_max_settled_order2", 0.3),
         "settle": ("settle_steps", 0), "transient": ("loss_avg_rel_err_max_transient", 0.3)}),
    "digits": (
        "a BN tanh network written in JAX (`from_jax`, D {dim:d}) on {n:d} of scikit-learn's "
        "digits, even vs odd: training loss {l0:.2f} → {l1:.4f} and train accuracy {acc:.0f} % "
        "at EoS entry (step {entry:d}); then eff. LR × sharpness {median:.3f} (median; "
        "{inside:.1f} % of the {samples:d} measurements after entry in [1.9, 2.1]), sharpness "
        "{s0:.0f} → {s1:.0f}, accuracy on the {m:d} held-out digits {t0:.1f} → {t1:.1f} % "
        "(chance {chance:.1f} %)",
        # after entry: 1e-15 perturbations of the start move the median by 5e-4, the fraction
        # in the band by 0.7 %, the final sharpness by 0.1 %, the final accuracy not at all
        {"dim": ("dim", 0), "n": ("n_train", 0), "l0": ("train_loss_start", 0),
         "l1": ("train_loss_at_entry", 0), "acc": ("train_accuracy_at_entry%", 0),
         "entry": ("eos_entry_step", 0), "median": ("eos_ratio_median_after_entry", 0.005),
         "inside": ("eos_ratio_fraction_in_band%", 0.02), "samples": ("eos_ratio_samples", 0),
         "s0": ("sharpness_at_entry", 0), "s1": ("sharpness_end", 0.02), "m": ("n_test", 0),
         "t0": ("test_accuracy_at_entry%", 0), "t1": ("test_accuracy_end%", 0.01),
         "chance": ("test_accuracy_chance%", 0)}),
    # no CIFAR-10 files on the machines that made this table: a row without numbers until a
    # run on the real data gives them (the check skips an experiment without its JSON)
    "cifar-sharpness": (
        "Lyu et al.'s scale-invariant VGG-11 on CIFAR-10-2k by full-batch GD+WD in XLA "
        "(`from_jax`): train/test accuracy, spherical sharpness and eff. LR × sharpness, as "
        "their Figure 2; needs the CIFAR-10 files (`--data DIR`), not run for this table",
        {}),
    # likewise no FashionMNIST files: a row without numbers
    "fashion-stability": (
        "Ma & Ying's fully connected ReLU net on FashionMNIST, square loss on one-hot labels, "
        "trained by SGD in XLA (`square_loss_from_jax`) over a grid of learning rates and "
        "batch sizes: sharpness, non-uniformity and g_W against g_x at each end point, as "
        "their Figure 1; needs the FashionMNIST files (`--data DIR`), not run for this table",
        {}),
}

# Numbers quoted in the README's prose: experiment -> [(template, fields)], as ROWS. "all" is
# `pysharp reproduce all`'s timing record (all.json); its times depend on the machine's load,
# which the sentence states, hence their tolerances.
SENTENCES: dict[str, list[tuple[str, dict[str, tuple[str, float]]]]] = {
    "all": [(
        "The last timed run took {seconds:.0f} s for the {n:d} experiments `all` ran, on the "
        "shared 2-core Xeon at load average {load:.1f}, with {threads:d} core thread(s) per "
        "experiment, {workers:d} at a time",
        {"seconds": ("seconds", 1.5), "n": ("experiments#", 0),
         "load": ("load_average_start.0", 1.0), "threads": ("threads", 0),
         "workers": ("workers", 0)})],
    "digits": [(
        "`digits` took {seconds:.0f} s more",
        {"seconds": ("seconds", 1.5)})],
    "central-flow": [(
        "on BN linear regression (`pysharp reproduce central-flow`), once the start's "
        "transient has passed, it matches GD+WD's {window:d}-step averages of the loss to "
        "{loss:.2f} % and of ‖w‖² to {norm2:.2f} % (max rel. error); the residual is the next "
        "order in the oscillation (the period-two orbit's fourth-order terms), which "
        "`order=2` adds: {loss2:.0e} and {norm22:.0e}.",
        {"window": ("average_window_steps", 0), "loss": ("loss_avg_rel_err_max_settled%", 0.05),
         "norm2": ("norm2_avg_rel_err_max_settled%", 0.05),
         "loss2": ("loss_avg_rel_err_max_settled_order2", 0.5),
         "norm22": ("norm2_avg_rel_err_max_settled_order2", 0.3)})],
}

_FIELD = re.compile(r"\{(\w+):([^}]*)\}")


def _value(summary: dict, path: str) -> float:
    if path == "one_minus_cosine_flow":
        return 1.0 - summary["cosine_flow"]
    if path.endswith("#"):                       # the number of entries of a list or dict
        return len(_value(summary, path[:-1]))
    percent = path.endswith("%")
    path = path.rstrip("%")
    value = summary
    for key in [path] if path in summary else path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return 100.0 * value if percent else value


def render(name: str, summary: dict, entry: tuple | None = None) -> str:
    """The README cell of experiment ``name`` from its JSON summary (or ``entry``'s text)."""
    template, fields = entry or ROWS[name]
    formats = dict(_FIELD.findall(template))
    values = {}
    for field, (path, _) in fields.items():
        value = _value(summary, path)
        values[field] = int(value) if formats[field].endswith("d") else float(value)
    return template.format(**values)


def _pattern(template: str, wrapped: bool = False) -> re.Pattern:
    """The template as a regex; ``wrapped``: any whitespace (a line break) between words."""
    def text(s):
        return r"\s+".join(re.escape(w) for w in s.split(" ")) if wrapped else re.escape(s)

    parts, last = [], 0
    for m in _FIELD.finditer(template):
        parts += [text(template[last:m.start()]), rf"(?P<{m[1]}>[-+0-9.e]+)"]
        last = m.end()
    parts.append(text(template[last:]))
    return re.compile("".join(parts))


def _resolution(text: str) -> float:
    """Half a unit in the last printed digit of a number as printed."""
    mantissa, _, exponent = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))


def compare(name: str, cell: str, summary: dict) -> list[str]:
    """Disagreements between a README cell and the JSON summary (empty: they agree)."""
    template, fields = ROWS[name]
    m = _pattern(template).fullmatch(cell.strip())
    if m is None:
        return [f"{name}: the README text is not the template's; "
                f"expected\n  {render(name, summary)}"]
    return _compare_fields(name, m, fields, summary)


def _compare_fields(name: str, m: re.Match, fields: dict, summary: dict) -> list[str]:
    problems = []
    for field, (path, rtol) in fields.items():
        shown, actual = float(m[field]), float(_value(summary, path))
        if abs(shown - actual) > rtol * abs(actual) + _resolution(m[field]) * (1 + 1e-9):
            problems.append(f"{name}: {path} is {actual:.6g}, README shows {m[field]} "
                            f"(tolerance {rtol:g} relative)")
    return problems


def _table(text: str) -> tuple[int, int]:
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        raise SystemExit(f"README has no {BEGIN} ... {END} block")
    return a + len(BEGIN), b


def _summaries(folder: Path) -> dict[str, dict]:
    found = {name: json.loads((folder / f"{name}.json").read_text())
             for name in ROWS if (folder / f"{name}.json").exists()}
    if (folder / "all.json").exists():               # `pysharp reproduce all`'s timing
        found["all"] = json.loads((folder / "all.json").read_text())
    if not found:
        raise SystemExit(f"no experiment JSON in {folder}: "
                         f"run `pysharp reproduce all --out {folder}`")
    quick = [name for name, s in found.items() if s.get("quick")]
    if quick:
        raise SystemExit(f"{', '.join(quick)} ran with --quick; the README shows default runs")
    return found


def _row_re(name: str) -> re.Pattern:
    return re.compile(rf"^\| `{re.escape(name)}` \| (.*) \|$", re.M)


def _sentence(text: str, name: str, entry: tuple) -> re.Match | None:
    found = list(_pattern(entry[0], wrapped=True).finditer(text))
    if len(found) > 1:
        raise SystemExit(f"README quotes a sentence of `{name}` {len(found)} times, expected 1")
    return found[0] if found else None


def update(text: str, summaries: dict[str, dict]) -> str:
    """README text with the rows (and quoted sentences) of these experiments regenerated."""
    a, b = _table(text)
    block = text[a:b]
    for name, summary in summaries.items():
        if name not in ROWS:                         # "all": sentences only
            continue
        cell = render(name, summary).replace("\\", "\\\\")
        block, n = _row_re(name).subn(f"| `{name}` | {cell} |", block)
        if n != 1:
            raise SystemExit(f"README's block has {n} rows for `{name}`, expected 1")
    text = text[:a] + block + text[b:]
    for name, summary in summaries.items():
        for entry in SENTENCES.get(name, []):
            m = _sentence(text, name, entry)
            if m is None:
                raise SystemExit(f"README does not quote this sentence of `{name}` (fix the "
                                 f"text by hand, then rerun):\n  {render(name, summary, entry)}")
            formats = dict(_FIELD.findall(entry[0]))
            for field in sorted(entry[1], key=m.start, reverse=True):
                value = _value(summary, entry[1][field][0])
                value = int(value) if formats[field].endswith("d") else float(value)
                text = text[:m.start(field)] + format(value, formats[field]) + text[m.end(field):]
    return text


def check(text: str, summaries: dict[str, dict]) -> list[str]:
    a, b = _table(text)
    problems = []
    for name, summary in summaries.items():
        m = _row_re(name).search(text[a:b]) if name in ROWS else None
        if name in ROWS:
            problems += [f"README's block has no row for `{name}`"] if m is None else \
                compare(name, m[1], summary)
        for entry in SENTENCES.get(name, []):
            s = _sentence(text, name, entry)
            problems += [f"{name}: README does not quote the sentence; expected\n  "
                         f"{render(name, summary, entry)}"] if s is None else \
                _compare_fields(name, s, entry[1], summary)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="output folder of `pysharp reproduce all`")
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a mismatch")
    parser.add_argument("--readme", default=str(README))
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    summaries = _summaries(Path(args.folder))
    text = readme.read_text()
    if args.check:
        problems = check(text, summaries)
        for p in problems:
            print(p, file=sys.stderr)
        print(f"{readme}: {len(summaries) - len({p.split(':')[0] for p in problems})} of "
              f"{len(summaries)} rows agree with {args.folder}")
        return 1 if problems else 0
    readme.write_text(update(text, summaries))
    print(f"rewrote {len(summaries)} rows of {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
