// pysharp._cpuinfo: what this x86-64 CPU, and the operating system on it, can run; and which
// instruction sets the portable build's core was compiled for (PYSHARP_CORE_TARGETS, set by
// CMakeLists.txt). Compiled for the baseline (no -march), so that it runs on every x86-64 CPU:
// pysharp/_engine/loader.py reads it before it loads one of the core's modules
// (pysharp/_core_<set>), and picks the best one the CPU runs.
//
// A feature counts when CPUID reports it and, for the AVX and AVX-512 registers, when the
// operating system saves their state across context switches (XGETBV reads XCR0): a CPU
// whose AVX-512 a hypervisor or kernel leaves disabled reports the instructions in CPUID
// while using them faults.
#if !(defined(__x86_64__) || defined(_M_X64))
#error "pysharp._cpuinfo is for x86-64 (other machines build one core, nothing to dispatch)"
#endif
#include <cpuid.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace py = pybind11;

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned subleaf = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, subleaf, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

std::uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

// Feature name (as Linux's /proc/cpuinfo spells it, but sse3: Linux's pni) -> usable here.
py::dict features() {
  const Regs l1 = cpuid(1);
  const unsigned max_leaf = cpuid(0).a;
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const unsigned max_ext = cpuid(0x80000000u).a;
  const Regs e1 = max_ext >= 0x80000001u ? cpuid(0x80000001u) : Regs{};
  // XCR0: bits 1-2 the XMM and YMM state, 5-7 the AVX-512 opmask and ZMM state.
  const std::uint64_t xcr0 = bit(l1.c, 27) ? xgetbv0() : 0;  // 27: OSXSAVE
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  py::dict f;
  f["sse2"] = bit(l1.d, 26);
  f["sse3"] = bit(l1.c, 0);
  f["ssse3"] = bit(l1.c, 9);
  f["cx16"] = bit(l1.c, 13);
  f["sse4_1"] = bit(l1.c, 19);
  f["sse4_2"] = bit(l1.c, 20);
  f["movbe"] = bit(l1.c, 22);
  f["popcnt"] = bit(l1.c, 23);
  f["xsave"] = bit(l1.c, 26);
  f["lahf_lm"] = bit(e1.c, 0);
  f["abm"] = bit(e1.c, 5);  // LZCNT
  f["avx"] = os_avx && bit(l1.c, 28);
  f["f16c"] = os_avx && bit(l1.c, 29);
  f["fma"] = os_avx && bit(l1.c, 12);
  f["bmi1"] = bit(l7.b, 3);
  f["avx2"] = os_avx && bit(l7.b, 5);
  f["bmi2"] = bit(l7.b, 8);
  f["avx512f"] = os_avx512 && bit(l7.b, 16);
  f["avx512dq"] = os_avx512 && bit(l7.b, 17);
  f["avx512cd"] = os_avx512 && bit(l7.b, 28);
  f["avx512bw"] = os_avx512 && bit(l7.b, 30);
  f["avx512vl"] = os_avx512 && bit(l7.b, 31);
  return f;
}

}  // namespace

PYBIND11_MODULE(_cpuinfo, m) {
  m.doc() = "The CPU's usable features and the instruction sets the portable core was built for.";
  m.def("features", &features,
        "{feature: usable} as CPUID and XCR0 report them; names as in Linux's "
        "/proc/cpuinfo (pni: sse3).");
  m.attr("targets") = py::str(PYSHARP_CORE_TARGETS).attr("split")(",");
}
