"""What the machine code of the CUDA kernels predicts, measured without a GPU.

``python -m bench.gpu_static [--compiler nvcc|nvrtc] [--json PATH] [--only SUBSTRING]``
compiles the kernels for sm_90 (nvcc, with the flags of the CMake build, when it is on
PATH; else NVRTC from PyPI, the CuPy backend's compiler), reads each kernel's machine code
and writes bench/results/gpu_static.json::

    {"kernels": {NAME: {"registers", "stack_bytes", "spill_bytes", "dmma_per_step",
                        "fp64_per_step", "predicted_traj_steps_per_s"}}}

Kernels: csrc/cuda/kernels.cuh instantiated for every (model, precision) of
csrc/builtin_models.hpp (named ``<kernel>_<Model>_<prec>``), and every kernel of
the csrc/cuda/*tile* sources (named by their demangled function name, which contains
"tile"; templates are instantiated through their ``// pysharp-instantiate:`` lines).

Where each figure comes from:

- ``registers``, ``stack_bytes``: ``cuobjdump --dump-resource-usage`` (REG, STACK).
- ``spill_bytes``: ptxas ``-v`` (the spill stores of the kernel's "Function properties").
- ``dmma_per_step``, ``fp64_per_step``: ``cuobjdump -sass`` (PyPI nvidia-cuda-cuobjdump and
  nvidia-cuda-nvdisasm read nvcc 13 cubins). The step loop is the innermost loop of the
  kernel (a span closed by a backward ``BRA``) that holds the most FP64 and DMMA
  instructions; its instructions are counted statically, once each: DMMA (FP64 tensor core,
  any shape) and FP64 vector arithmetic (DADD, DMUL, DFMA, DSETP, DMNMX, DSET). The figure is
  per step when the loop body is one step: a tile kernel's step loop carries
  ``#pragma unroll 1`` (else the count is per unrolled group). Slow paths inside the body
  (a divide's or a square root's rarely taken branch) are counted too.
- ``predicted_traj_steps_per_s``: the issue-limited ceiling of the H200 (../shared/
  gpu-design.md): 132 SMs at 1.98 GHz; per SM and clock, 4 warp instructions issued (one per
  scheduler), 64 FP64 FMA lanes (a warp's FP64 instruction holds the pipe for 0.5 clock) and
  128 FP64 tensor-core FMAs (67 TFLOP/s: a DMMA m8n8k4, 256 FMAs, holds it 2 clocks); on
  Hopper DMMA and FP64 vector instructions share one pipe, so their times add. One step of
  one warp costs ``max(0.5 fp64 + fma(dmma) / 128, all_instructions / 4)`` SM-clocks, and
  the ceiling is ``132 * 1.98e9 * trajectories_per_warp / that``. Trajectories per warp:
  the rows of the DMMA shape (8 for m8n8k4, 16 for m16n8kX) when the step loop uses DMMA,
  else 32 (one per thread), unless a source says otherwise with a line
  ``// pysharp-traj-per-warp: KERNEL_NAME_SUBSTRING N`` (a warp per trajectory: N = 1).
  A tile whose step loops over shapes known only at run time (BN matrix completion's: N
  observations, D coordinates) has no static per-step count; a source line
  ``// pysharp-run-time-shape: KERNEL_NAME_SUBSTRING`` leaves its three step figures null.
  Memory is left out: a fused kernel moves ~16 D / T bytes per trajectory-step.

The generic engine's kernels (one thread per trajectory, all methods, loops over D inside a
step) have no static per-step count: their three step figures are null, and only registers,
stack and spills are reported. Everything here is a prediction from machine code, to be
measured on a device before it is believed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CSRC = REPO / "csrc"
RESULT = REPO / "bench" / "results" / "gpu_static.json"
ARCH = "sm_90"

# H200 SXM (gpu-design.md).
SMS, CLOCK_HZ = 132, 1.98e9
ISSUE_PER_CLK = 4.0       # warp instructions per SM per clock
FP64_CLK_PER_INSTR = 0.5  # 64 FP64 FMA lanes per SM: a 32-lane instruction takes half a clock
DMMA_FMA_PER_CLK = 128.0  # 67 TFLOP/s of FP64 tensor core over 132 SMs at 1.98 GHz

FP64_OPS = {"DADD", "DMUL", "DFMA", "DSETP", "DMNMX", "DSET"}
NVCC_FLAGS = ["-std=c++17", "--expt-relaxed-constexpr", "-O3"]

_INSTR_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?"
                       r"([A-Z][A-Z0-9_]*)([.\w]*)\s*([^;]*);")
_FUNC_RE = re.compile(r"Function\s*:\s*(\S+)")
_RES_RE = re.compile(r"Function\s+(\S+?):\s*\n\s*REG:(\d+)\s+STACK:(\d+)")
_PTXAS_FN_RE = re.compile(r"Function properties for (\S+)\n.*?(\d+) bytes stack frame, "
                          r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_TPW_RE = re.compile(r"//\s*pysharp-traj-per-warp:\s*(\S+)\s+(\d+)")
_RUN_TIME_SHAPE_RE = re.compile(r"//\s*pysharp-run-time-shape:\s*(\S+)")


@dataclass
class Instr:
    addr: int
    op: str
    mods: str
    operands: str


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """``cuobjdump -sass`` output -> {mangled function name: instructions in address order}."""
    funcs: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in text.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            current = funcs.setdefault(m.group(1), [])
            continue
        m = _INSTR_RE.search(line)
        if m and current is not None:
            current.append(Instr(int(m.group(1), 16), m.group(3), m.group(4), m.group(5)))
    return funcs


def loops(instrs: list[Instr]) -> list[tuple[int, int]]:
    """(first, last) index spans of the loops: a BRA back to an earlier address."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}
    spans = []
    for i, ins in enumerate(instrs):
        if ins.op != "BRA":
            continue
        m = re.search(r"0x([0-9a-f]+)", ins.operands)
        if m and int(m.group(1), 16) <= ins.addr and int(m.group(1), 16) in index:
            spans.append((index[int(m.group(1), 16)], i))
    return spans


def dmma_shape(mods: str) -> tuple[int, int, int]:
    """DMMA.8x8x4 -> (8, 8, 4) (sm_90's spelling); also DMMA.884, DMMA.1684, DMMA.16816."""
    digits = mods.lstrip(".").split(".")[0]
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", digits)
    if m:
        return int(m.group(1)), int(m.group(2)), int(m.group(3))
    if digits.startswith("16"):
        return 16, 8, int(digits[3:] or 4)
    return 8, 8, int(digits[2:] or 4)


@dataclass
class StepCounts:
    instructions: int
    fp64: int
    dmma: int
    dmma_fma: int
    dmma_rows: int


def step_loop(instrs: list[Instr]) -> StepCounts | None:
    """Counts of the innermost loop with the most FP64 and DMMA instructions (None: no loop)."""
    spans = loops(instrs)
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    best = None
    for a, b in inner:
        body = instrs[a:b + 1]
        fp64 = sum(ins.op in FP64_OPS for ins in body)
        dmma = [dmma_shape(ins.mods) for ins in body if ins.op == "DMMA"]
        c = StepCounts(len(body), fp64, len(dmma), sum(m * n * k for m, n, k in dmma),
                       max((m for m, _, _ in dmma), default=0))
        if best is None or c.fp64 + c.dmma > best.fp64 + best.dmma:
            best = c
    return best


def predicted_rate(c: StepCounts, traj_per_warp: int) -> float:
    """Traj-steps/s at the issue-limited ceiling of the H200 (module docstring)."""
    pipe = FP64_CLK_PER_INSTR * c.fp64 + c.dmma_fma / DMMA_FMA_PER_CLK
    issue = c.instructions / ISSUE_PER_CLK
    return SMS * CLOCK_HZ * traj_per_warp / max(pipe, issue)


def tool(name: str) -> str:
    """A CUDA binary utility: PATH, then the PyPI wheels (nvidia-cuda-cuobjdump, -nvdisasm)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
        found = find_nvidia_binary_utility(name)
    except Exception:
        found = None
    if found:
        return str(found)
    try:
        import nvidia
        for root in nvidia.__path__:
            p = Path(root) / "cu13" / "bin" / name
            if p.is_file():
                return str(p)
    except ImportError:
        pass
    raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-cuobjdump "
                            "nvidia-cuda-nvdisasm (or put the CUDA toolkit's bin on PATH)")


def cuobjdump(cubin: Path, *args: str) -> str:
    exe = tool("cuobjdump")
    env = dict(os.environ)
    env["PATH"] = str(Path(tool("nvdisasm")).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run([exe, *args, str(cubin)], check=True, capture_output=True,
                          text=True, env=env).stdout


def short_name(plain: str) -> str:
    """``void pysharp::cuda::k<40, 20>(Args...)`` -> ``k<40, 20>``."""
    name = plain.removeprefix("void ").removeprefix("pysharp::cuda::")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def demangle(names: list[str]) -> dict[str, str]:
    exe = shutil.which("cu++filt") or shutil.which("c++filt")
    if not exe or not names:
        return {n: n for n in names}
    out = subprocess.run([exe], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines())) if out else {n: n for n in names}


@dataclass
class Unit:
    """One compilation: source text, name expressions, and a label for each."""

    name: str
    source: str
    expressions: dict[str, str]  # name expression -> report name ("" : name from the cubin)


def engine_units() -> list[Unit]:
    from pysharp._backends import _cuda_sources as cs
    units = []
    for model, prec in cs.cuda_units(CSRC / "builtin_models.hpp"):
        names = cs.kernel_names(model, prec)
        units.append(Unit(f"{model}_{prec}", cs.KERNELS_SOURCE,
                          {expr: f"{short}_{model}_{prec}" for short, expr in names.items()}))
    for src in cs.tile_sources(CSRC / "cuda"):
        units.append(Unit(src.stem, cs.source_text(src),
                          dict.fromkeys(cs.declared_instantiations(src), "")))
    return units


def compile_unit(unit: Unit, compiler: str, workdir: Path) -> tuple[Path, str, dict[str, str]]:
    """(cubin path, ptxas -v log, mangled name -> report name) for one unit."""
    include = [CSRC / "include", CSRC]
    cubin = workdir / f"{unit.name}.cubin"
    if compiler == "nvrtc":
        from pysharp._backends import _nvrtc
        out = _nvrtc.compile_cuda(unit.source, arch=ARCH, name=f"{unit.name}.cu",
                                  name_expressions=list(unit.expressions), include_dirs=include,
                                  options=["--ptxas-options=-v"])
        cubin.write_bytes(out.cubin)
        return cubin, out.log, {out.lowered[e]: n for e, n in unit.expressions.items() if n}
    # nvcc: taking each instantiation's address makes the front end instantiate it.
    refs = ", ".join(f"(const void*)&{e}" for e in unit.expressions)
    cu = workdir / f"{unit.name}.cu"
    cu.write_text(unit.source + (f"const void* pysharp_gpu_static_refs[] = {{{refs}}};\n"
                                 if refs else ""))
    cmd = [compiler_path("nvcc"), "-cubin", f"-arch={ARCH}", *NVCC_FLAGS, "-Xptxas", "-v",
           *(f"-I{d}" for d in include), "-o", str(cubin), str(cu)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(f"nvcc failed on {unit.name}:\n{run.stderr[-4000:]}")
    labels = {}
    if unit.expressions:  # match mangled names to expressions through their demangled form
        mangled = list(parse_sass(cuobjdump(cubin, "-sass")))
        plain = demangle(mangled)
        for expr, label in unit.expressions.items():
            key = re.sub(r"\s+", "", expr)
            for m in mangled:
                if label and re.sub(r"\s+", "", plain[m]).startswith(f"void{key}("):
                    labels[m] = label
    return cubin, run.stderr, labels


def compiler_path(name: str) -> str:
    return shutil.which(name) or f"/usr/local/cuda/bin/{name}"


def _cuda_sources() -> list[str]:
    return [p.read_text() for p in sorted((CSRC / "cuda").glob("*")) if p.suffix in (".cu", ".cuh")]


def traj_per_warp_overrides() -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for text in _cuda_sources()
            for m in _TPW_RE.finditer(text)]


def run_time_shapes() -> list[str]:
    """Name substrings of the tile kernels whose step has no static count (docstring)."""
    return [m.group(1) for text in _cuda_sources() for m in _RUN_TIME_SHAPE_RE.finditer(text)]


def analyse(cubin: Path, ptxas_log: str, labels: dict[str, str]) -> dict[str, dict]:
    """Per kernel of one cubin: the six figures of the module docstring."""
    resources = {m.group(1): (int(m.group(2)), int(m.group(3)))
                 for m in _RES_RE.finditer(cuobjdump(cubin, "--dump-resource-usage"))}
    spills = {m.group(1): int(m.group(3)) for m in _PTXAS_FN_RE.finditer(ptxas_log)}
    funcs = parse_sass(cuobjdump(cubin, "-sass"))
    plain = demangle([f for f in funcs if f not in labels])
    overrides, run_time = traj_per_warp_overrides(), run_time_shapes()
    report = {}
    for mangled, instrs in funcs.items():
        name = labels.get(mangled) or short_name(plain.get(mangled, mangled))
        regs, stack = resources.get(mangled, (None, None))
        row = {"registers": regs, "stack_bytes": stack, "spill_bytes": spills.get(mangled),
               "dmma_per_step": None, "fp64_per_step": None, "predicted_traj_steps_per_s": None}
        static = "tile" in name and not any(sub in name for sub in run_time)
        steps = step_loop(instrs) if static else None
        if steps is not None:
            tpw = steps.dmma_rows or 32
            for sub, n in overrides:
                if sub in name:
                    tpw = n
            row.update(dmma_per_step=steps.dmma, fp64_per_step=steps.fp64,
                       predicted_traj_steps_per_s=float(f"{predicted_rate(steps, tpw):.3g}"))
        report[name] = row
    return report


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compiler", choices=("auto", "nvcc", "nvrtc"), default="auto")
    ap.add_argument("--json", type=Path, default=RESULT)
    ap.add_argument("--only", default="", help="compile only units whose name contains this "
                    "(the other rows of an existing --json are kept)")
    args = ap.parse_args(argv)
    compiler = args.compiler
    if compiler == "auto":
        compiler = "nvcc" if shutil.which("nvcc") else "nvrtc"
    kernels: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for unit in engine_units():
            if args.only not in unit.name:
                continue
            print(f"{unit.name}: compiling with {compiler} for {ARCH}", flush=True)
            kernels.update(analyse(*compile_unit(unit, compiler, Path(tmp))))
    if args.only and args.json.is_file():  # a partial run updates the rows it measured
        kernels = {**json.loads(args.json.read_text())["kernels"], **kernels}
    result = {"kernels": dict(sorted(kernels.items()))}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    width = max((len(k) for k in kernels), default=10)
    print(f"{'kernel':{width}}  regs  stack  spill  dmma/step  fp64/step  predicted/s")
    for k, r in result["kernels"].items():
        def f(v):
            return "-" if v is None else v
        print(f"{k:{width}}  {f(r['registers']):>4}  {f(r['stack_bytes']):>5}  "
              f"{f(r['spill_bytes']):>5}  {f(r['dmma_per_step']):>9}  {f(r['fp64_per_step']):>9}"
              f"  {f(r['predicted_traj_steps_per_s']):>11}")
    print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
