// The lane code on another instruction set: built by an aarch64 g++ (NEON lanes) and run
// under qemu-user by tests/csrc/test_aarch64.py. It checks what the design promises on
// every target (docs/conventions.rst, Determinism): the vector elementary functions
// within a few ulp of <cmath>, a row's bits independent of its lane and block, and the
// lane path within rounding of the scalar one; then, for every built-in model (BN linear
// regression and the BN two-layer net through core/dense.hpp's NEON register blocks, BN
// matrix completion, Toy3D), the lane kernels against the scalar path and finite
// differences, and the trajectory engine and Lanczos against a plain loop, a dense
// eigensolve and themselves at other thread counts and batch positions. Prints
// "N passed, M failed"; exits 1 on any failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cpu/batched.hpp"
#include "cpu/engine.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/bn_two_layer_net.hpp"
#include "pysharp/models/toy3d.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

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


// A deterministic point of the test: entries sin(a i + b) + c.
std::vector<double> wave(std::int64_t size, double a, double b, double c = 0.0) {
  std::vector<double> x(size);
  for (std::int64_t i = 0; i < size; ++i) x[i] = std::sin(a * i + b) + c;
  return x;
}

double max_abs(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x) m = std::fmax(m, std::fabs(v));
  return m;
}

// max |a - b| / max |b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::fmax(d, std::fabs(a[i] - b[i]));
  return d / std::fmax(max_abs(b), 1e-300);
}

// The scalar path's gradient of row b of W (B, D).
template <class Model>
std::vector<double> scalar_grad(const Model& m, const double* w) {
  std::vector<double> g(m.dim()), work(m.work_size() + 1);
  double loss;
  m.loss_grad(w, &loss, g.data(), work.data());
  return g;
}

// The lane kernels of one model on B rows: loss and gradient against the scalar path, the HVP
// against central differences of the scalar gradient, D^3L[v, v] against central differences
// of the HVP, and a row's HVP bits independent of its lane.
template <class Model>
void kernel_checks(const char* name, const Model& m) {
  const int D = m.dim();
  const std::int64_t B = 11;
  const std::vector<double> W = wave(B * D, 0.37, 0.2, 0.1), V = wave(B * D, 0.91, 1.3);
  std::vector<double> loss(B), G(B * D), H(B * D), T(B * D);
  std::vector<std::uint8_t> ok(B), okh(B), okt(B);
  cpu::loss_grad_lanes(m, W.data(), B, loss.data(), G.data(), ok.data());
  cpu::directional<1>(m, W.data(), V.data(), B, H.data(), okh.data());
  cpu::directional<2>(m, W.data(), V.data(), B, T.data(), okt.data());
  double grad_err = 0.0, hvp_err = 0.0, third_err = 0.0;
  bool defined = true;
  const double h = 1e-5;
  for (std::int64_t b = 0; b < B; ++b) {
    defined = defined && ok[b] == 1 && okh[b] == 1 && okt[b] == 1;
    const double* w = W.data() + b * D;
    const double* v = V.data() + b * D;
    const std::vector<double> g(G.begin() + b * D, G.begin() + (b + 1) * D);
    grad_err = std::fmax(grad_err, rel_diff(g, scalar_grad(m, w)));
    std::vector<double> wp(w, w + D), wm(w, w + D);
    for (int i = 0; i < D; ++i) {
      wp[i] += h * v[i];
      wm[i] -= h * v[i];
    }
    const std::vector<double> gp = scalar_grad(m, wp.data()), gm = scalar_grad(m, wm.data());
    std::vector<double> fd(D), hv(H.begin() + b * D, H.begin() + (b + 1) * D);
    for (int i = 0; i < D; ++i) fd[i] = (gp[i] - gm[i]) / (2 * h);
    hvp_err = std::fmax(hvp_err, rel_diff(hv, fd));
    std::vector<double> hp(D), hm(D);
    std::uint8_t o1, o2;
    cpu::directional<1>(m, wp.data(), v, 1, hp.data(), &o1);
    cpu::directional<1>(m, wm.data(), v, 1, hm.data(), &o2);
    std::vector<double> t(T.begin() + b * D, T.begin() + (b + 1) * D);
    for (int i = 0; i < D; ++i) fd[i] = (hp[i] - hm[i]) / (2 * h);
    third_err = std::fmax(third_err, rel_diff(t, fd));
  }
  char what[160];
  std::snprintf(what, sizeof what, "%s: every row defined", name);
  check(defined, what, 0.0);
  std::snprintf(what, sizeof what, "%s: lane gradient = scalar gradient to rounding", name);
  check(grad_err < 1e-12, what, grad_err);
  std::snprintf(what, sizeof what, "%s: HVP = central differences of the gradient", name);
  check(hvp_err < 1e-6, what, hvp_err);
  std::snprintf(what, sizeof what, "%s: D3L[v, v] = central differences of the HVP", name);
  check(third_err < 1e-5, what, third_err);
  // rows 3.. alone: the same bits as in the batch
  std::vector<double> H2((B - 3) * D);
  std::vector<std::uint8_t> ok2(B - 3);
  cpu::directional<1>(m, W.data() + 3 * D, V.data() + 3 * D, B - 3, H2.data(), ok2.data());
  std::snprintf(what, sizeof what, "%s: a row's HVP bits do not depend on its lane", name);
  check(std::memcmp(H.data() + 3 * D, H2.data(), H2.size() * sizeof(double)) == 0, what, 0.0);
}

// The largest eigenvalue of the symmetric D x D matrix A (row-major), by cyclic Jacobi
// rotations: the independent oracle of Lanczos.
double top_eigenvalue(std::vector<double> A, int D) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (int i = 0; i < D; ++i) {
      diag += A[i * D + i] * A[i * D + i];
      for (int j = i + 1; j < D; ++j) off += A[i * D + j] * A[i * D + j];
    }
    if (off <= 1e-32 * diag) break;
    for (int p = 0; p < D; ++p)
      for (int q = p + 1; q < D; ++q) {
        const double apq = A[p * D + q];
        if (apq == 0.0) continue;
        const double theta = (A[q * D + q] - A[p * D + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < D; ++k) {  // A P
          const double akp = A[k * D + p], akq = A[k * D + q];
          A[k * D + p] = c * akp - s * akq;
          A[k * D + q] = s * akp + c * akq;
        }
        for (int k = 0; k < D; ++k) {  // P^T (A P)
          const double apk = A[p * D + k], aqk = A[q * D + k];
          A[p * D + k] = c * apk - s * aqk;
          A[q * D + k] = s * apk + c * aqk;
        }
      }
  }
  double top = A[0];
  for (int i = 1; i < D; ++i) top = std::fmax(top, A[i * D + i]);
  return top;
}

// One GD+WD run of B trajectories from the rows of W0 (B, D): final iterates and sharpness.
struct Run {
  std::vector<double> w, sharpness;
};

template <class Model>
Run run_gd_wd(const Model& m, const std::vector<double>& W0, long long B, long long offset,
              long long steps, long long sharp_every, double lr, double wd) {
  const int D = m.dim();
  EngineConfig c;
  c.method = Method::gd_wd;
  c.steps = steps;
  c.record_every = steps;
  c.sharpness_every = sharp_every;
  c.lanczos.max_iter = D;
  c.lanczos.min_iter = std::min(D, 4);
  const long long nrec = n_records(steps, steps), nsh = n_records(steps, sharp_every);
  std::vector<double> lrs(B, lr), wds(B, wd);
  Hyperparameters<double> hp;
  hp.lr = lrs.data();
  hp.wd = wds.data();
  std::vector<double> loss(nrec * B), norm2(nrec * B), eff(nrec * B), gn(nrec * B),
      top_grad(nrec * B), sharp(nsh * B), ratio(nsh * B), w(B * D);
  std::vector<std::uint8_t> conv(nsh * B), div(B);
  std::vector<long long> div_step(B);
  BatchRecords<double> out;
  out.loss = loss.data();
  out.norm2 = norm2.data();
  out.eff_lr = eff.data();
  out.grad_norm = gn.data();
  out.top_grad = sharp_every > 0 ? top_grad.data() : nullptr;
  out.sharpness = sharp.data();
  out.eos_ratio = ratio.data();
  out.sharpness_converged = conv.data();
  out.w_final = w.data();
  out.diverged = div.data();
  out.diverged_step = div_step.data();
  cpu::run_batch(m, c, W0.data(), hp, B, offset, out);
  return {w, sharp};
}

// The engine on one model: a plain scalar GD+WD loop to rounding, and the same bits at
// 1 and 2 threads and for a trajectory run inside a batch or alone; its sharpness against
// the power iteration of the dense Hessian (cpu::hessian), on the unit sphere.
template <class Model>
void engine_checks(const char* name, const Model& m) {
  const int D = m.dim();
  const long long B = 9, steps = 40;
  const double lr = 0.05, wd = 1e-3;
  const std::vector<double> W0 = wave(B * D, 0.53, 0.7, 0.05);
#ifdef _OPENMP
  omp_set_num_threads(2);
#endif
  const Run two = run_gd_wd(m, W0, B, 0, steps, 20, lr, wd);
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
  const Run one = run_gd_wd(m, W0, B, 0, steps, 20, lr, wd);
  const std::vector<double> tail(W0.begin() + 5 * D, W0.end());
  const Run alone = run_gd_wd(m, tail, B - 5, 5, steps, 20, lr, wd);
  char what[160];
  std::snprintf(what, sizeof what, "%s: the engine's bits at 1 and 2 threads", name);
  check(one.w == two.w && one.sharpness == two.sharpness, what, 0.0);
  std::snprintf(what, sizeof what, "%s: a trajectory's bits inside a batch or alone", name);
  check(std::memcmp(one.w.data() + 5 * D, alone.w.data(), alone.w.size() * sizeof(double)) == 0,
        what, 0.0);
  // a plain loop on the scalar path: w <- (1 - lr wd) w - lr grad L(w)
  double loop_err = 0.0;
  for (long long b = 0; b < B; ++b) {
    std::vector<double> w(W0.begin() + b * D, W0.begin() + (b + 1) * D);
    for (long long t = 0; t < steps; ++t) {
      const std::vector<double> g = scalar_grad(m, w.data());
      for (int i = 0; i < D; ++i) w[i] = (1 - lr * wd) * w[i] - lr * g[i];
    }
    const std::vector<double> got(one.w.begin() + b * D, one.w.begin() + (b + 1) * D);
    loop_err = std::fmax(loop_err, rel_diff(got, w));
  }
  std::snprintf(what, sizeof what, "%s: the engine = a plain GD+WD loop to rounding", name);
  check(loop_err < 1e-12, what, loop_err);
  // the sharpness at step 0: the top eigenvalue of the dense Hessian (cpu::hessian) at
  // theta = w0 / ||w0||, by Jacobi's method
  double sharp_err = 0.0;
  for (long long b = 0; b < B; ++b) {
    std::vector<double> th(W0.begin() + b * D, W0.begin() + (b + 1) * D), Hd(D * D);
    double n2 = 0.0;
    for (double x : th) n2 += x * x;
    for (double& x : th) x /= std::sqrt(n2);
    std::uint8_t okd;
    cpu::hessian(m, th.data(), 1, Hd.data(), &okd);
    const double lam = top_eigenvalue(Hd, D);
    sharp_err = std::fmax(sharp_err, std::fabs(one.sharpness[b] - lam) / std::fabs(lam));
  }
  std::snprintf(what, sizeof what, "%s: Lanczos sharpness = the dense eigensolve", name);
  check(sharp_err < 1e-8, what, sharp_err);
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


  // Every built-in model: its kernels and the engine on NEON lane blocks.
  const int n = 20, d = 13, r = 3;
  std::vector<double> X = wave(n * d, 0.61, 0.4), y = wave(n, 1.9, 0.8, 0.3);
  for (int j = 0; j < d; ++j) {  // centre the columns
    double mean = 0.0;
    for (int i = 0; i < n; ++i) mean += X[i * d + j] / n;
    for (int i = 0; i < n; ++i) X[i * d + j] -= mean;
  }
  double fro2 = 0.0, ymean = 0.0, yvar = 0.0;
  for (double x : X) fro2 += x * x;
  for (double v : y) ymean += v / n;
  std::vector<double> u(n);
  for (int i = 0; i < n; ++i) yvar += (y[i] - ymean) * (y[i] - ymean) / n;
  for (int i = 0; i < n; ++i) u[i] = (y[i] - ymean) / std::sqrt(n * yvar);
  const BNLinearRegression<double> lin{X.data(), u.data(), 2 * yvar, fro2, n, d};
  const BNTwoLayerNet<double> net{X.data(), y.data(), fro2, 1 / std::sqrt(3.0), n, d, 3,
                                  Activation::tanh};
  const int N = 17, m1 = 5, m2 = 4;
  std::vector<int> rows(N), cols(N);
  for (int k = 0; k < N; ++k) {
    rows[k] = (3 * k + 1) % m1;
    cols[k] = (5 * k + 2) % m2;
  }
  std::vector<double> vals = wave(N, 2.3, 0.1), umc(N);
  double vmean = 0.0, vvar = 0.0;
  for (double v : vals) vmean += v / N;
  for (double v : vals) vvar += (v - vmean) * (v - vmean) / N;
  for (int k = 0; k < N; ++k) umc[k] = (vals[k] - vmean) / std::sqrt(N * vvar);
  const BNMatrixCompletion<double> mc{rows.data(), cols.data(), umc.data(), 2 * vvar, N, m1, m2,
                                      r};
  // BN linear regression written out in plain loops, the oracle of core/dense.hpp's blocks
  // (n 20 and d 13 leave remainders in both products): with z = Xc w,
  // L = scale (1 - z.u / ||z||), grad = Xc^T dL/dz, dL/dz = scale ((z.u) z / ||z||^3 - u / ||z||).
  {
    const std::vector<double> w = wave(d, 0.77, 0.9, 0.2);
    std::vector<double> z(n, 0.0), grad(d, 0.0), gl(d);
    double zz = 0.0, zu = 0.0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < d; ++j) z[i] += X[i * d + j] * w[j];
      zz += z[i] * z[i];
      zu += z[i] * u[i];
    }
    const double nz = std::sqrt(zz), L = 2 * yvar * (1 - zu / nz);
    for (int i = 0; i < n; ++i) {
      const double dz = 2 * yvar * (zu * z[i] / (zz * nz) - u[i] / nz);
      for (int j = 0; j < d; ++j) grad[j] += X[i * d + j] * dz;
    }
    std::vector<double> wl = w;  // the lane driver, one row
    double ll;
    std::uint8_t okl;
    cpu::loss_grad_lanes(lin, wl.data(), 1, &ll, gl.data(), &okl);
    check(std::fabs(ll - L) <= 1e-13 * std::fabs(L) && rel_diff(gl, grad) < 1e-12,
          "bn_linear_regression: lanes = the formula in plain loops",
          std::fmax(std::fabs(ll - L) / std::fabs(L), rel_diff(gl, grad)));
  }
  kernel_checks("bn_linear_regression", lin);
  kernel_checks("bn_two_layer_net", net);
  kernel_checks("bn_matrix_completion", mc);
  kernel_checks("toy3d", model);
  engine_checks("bn_linear_regression", lin);
  engine_checks("bn_two_layer_net", net);
  engine_checks("bn_matrix_completion", mc);
  engine_checks("toy3d", model);

  std::printf("aarch64 smoke: lanes %d\n%d passed, %d failed\n", kNativeLanes<double>, passed,
              failed);
  return failed ? 1 : 0;
}
