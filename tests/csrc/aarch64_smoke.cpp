// The lane code on another instruction set: built by an aarch64 g++ (NEON lanes) and run
// under qemu-user by tests/csrc/test_aarch64.py. It checks what the design promises on
// every target (docs/conventions.rst, Determinism): the vector elementary functions
// within a few ulp of <cmath>, a row's bits independent of its lane and block, and the
// lane path within rounding of the scalar one. Prints "N passed, M failed"; exits 1 on
// any failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cpu/batched.hpp"
#include "pysharp/models/toy3d.hpp"

using namespace pysharp;

namespace {

int passed = 0, failed = 0;

void check(bool ok, const char* what, double detail) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED %s (%.17g)\n", what, detail);
  }
}

double ulps(double got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : 1e300;
  if (std::isinf(want)) return got == want ? 0.0 : 1e300;
  const double spacing = std::nextafter(std::fabs(want), INFINITY) - std::fabs(want);
  return std::fabs(got - want) / spacing;
}

template <class F, class G>
void elementary(const char* name, F lanes_fn, G cmath_fn, double lo, double hi, double bound) {
  constexpr int L = kNativeLanes<double>;
  double worst = 0.0;
  for (int i = 0; i < 4096; i += L) {
    Lanes<double, L> x(0.0);
    for (int l = 0; l < L; ++l) x.set(l, lo + (hi - lo) * ((i + l) % 4096) / 4095.0);
    const Lanes<double, L> y = lanes_fn(x);
    for (int l = 0; l < L; ++l) {
      const double e = ulps(y[l], cmath_fn(x[l]));
      worst = e > worst ? e : worst;
    }
  }
  check(worst <= bound, name, worst);
}

}  // namespace

int main() {
  using V = Lanes<double, kNativeLanes<double>>;
  elementary("exp", [](const V& x) { return exp_(x); }, [](double x) { return std::exp(x); },
             -700.0, 700.0, 2.0);
  elementary("log", [](const V& x) { return log_(x); }, [](double x) { return std::log(x); },
             1e-3, 1e3, 2.0);
  elementary("tanh", [](const V& x) { return tanh_(x); }, [](double x) { return std::tanh(x); },
             -5.0, 5.0, 2.5);
  elementary("expm1", [](const V& x) { return expm1_(x); },
             [](double x) { return std::expm1(x); }, -3.0, 3.0, 3.0);
  elementary("log1p", [](const V& x) { return log1p_(x); },
             [](double x) { return std::log1p(x); }, -0.9, 9.0, 2.5);
  elementary("sin", [](const V& x) { return sin_(x); }, [](double x) { return std::sin(x); },
             -1e4, 1e4, 2.0);
  elementary("cos", [](const V& x) { return cos_(x); }, [](double x) { return std::cos(x); },
             -1e4, 1e4, 2.0);

  // Rows of a (B, 3) batch through the lane driver: the same bits in any lane and block.
  const Toy3D<double> model{10.0};
  const std::int64_t B = 37;
  std::vector<double> W(B * 3);
  for (std::int64_t i = 0; i < B * 3; ++i) W[i] = std::sin(0.7 * i + 0.1) + 0.05;
  std::vector<double> loss(B), G(B * 3);
  std::vector<std::uint8_t> ok(B);
  cpu::loss_grad_lanes(model, W.data(), B, loss.data(), G.data(), ok.data());
  const std::int64_t shift = 5;
  std::vector<double> loss2(B - shift), G2((B - shift) * 3);
  std::vector<std::uint8_t> ok2(B - shift);
  cpu::loss_grad_lanes(model, W.data() + shift * 3, B - shift, loss2.data(), G2.data(),
                       ok2.data());
  check(std::memcmp(loss.data() + shift, loss2.data(), (B - shift) * sizeof(double)) == 0 &&
            std::memcmp(G.data() + shift * 3, G2.data(), (B - shift) * 3 * sizeof(double)) == 0,
        "a row's bits do not depend on its lane", 0.0);

  // Against the scalar instantiation of the same loss_grad: rounding apart.
  double worst = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    double l, g[3];
    model.loss_grad(W.data() + b * 3, &l, g, static_cast<double*>(nullptr));
    worst = std::fmax(worst, std::fabs(l - loss[b]) / std::fabs(l));
    for (int i = 0; i < 3; ++i) worst = std::fmax(worst, std::fabs(g[i] - G[b * 3 + i]));
  }
  check(worst < 1e-13 && ok[0] == 1, "lanes agree with the scalar path", worst);

  std::printf("aarch64 smoke: lanes %d\n%d passed, %d failed\n", kNativeLanes<double>, passed,
              failed);
  return failed ? 1 : 0;
}
