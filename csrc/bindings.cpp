// pybind11 module pysharp._core: thin wrappers over the batched drivers.
//
// Arguments arrive already validated by the Python layer (pysharp/_engine/validation.py);
// the checks here only guard the interpreter against a direct misuse.
// Every kernel runs with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "builtin_models.hpp"
#include "cpu/batched.hpp"
#include "holders.hpp"

namespace py = pybind11;
using namespace pysharp;
using namespace pysharp::module;

namespace {


// Lanczos on a Python callable: the same C++ recurrence, the GIL held while
// the callable runs. Its result is anything numpy.asarray accepts.
py::tuple lanczos_callable(const py::function& matvec, int D, const py::dict& options,
                           std::optional<carray<double>> start) {
  const LanczosOptions o = module::lanczos_options_from(options, D);
  const int k = o.k;
  if (start) require(start->size() == D, "start must have shape (dim,)");
  std::vector<double> scratch(lanczos_scratch_size(D, o));
  carray<double> evals(k), evecs({k, D}), resid(k);
  auto apply = [&](const double* x, double* y) {
    carray<double> xa(D);
    std::copy(x, x + D, xa.mutable_data());
    py::object r = matvec(xa);
    auto ya = py::cast<carray<double>>(py::module_::import("numpy").attr("asarray")(r));
    require(ya.size() == D, "matvec must return a vector of length dim");
    std::copy(ya.data(), ya.data() + D, y);
    for (int i = 0; i < D; ++i)
      if (!std::isfinite(y[i])) throw std::domain_error("matvec returned a non-finite value");
    return true;
  };
  const LanczosReport rep = lanczos(apply, D, o, start ? start->data() : nullptr,
                                    evals.mutable_data(), evecs.mutable_data(),
                                    resid.mutable_data(), scratch.data());
  return py::make_tuple(evals, evecs, resid, rep.iterations, rep.converged);
}

// The unit eigenvector of each tridiagonal (d[b], e[b]) (B, m) for its
// eigenvalue theta[b], by inverse iteration (tridiagonal_eigenvector). For tests.
carray<double> tridiagonal_eigenvectors(const carray<double>& d, const carray<double>& e,
                                        const carray<double>& theta) {
  require(d.ndim() == 2 && e.ndim() == 2 && d.shape(0) == e.shape(0) &&
              d.shape(1) == e.shape(1) && theta.ndim() == 1 && theta.shape(0) == d.shape(0),
          "d and e must both have shape (B, m), theta (B,)");
  const py::ssize_t B = d.shape(0), m = d.shape(1);
  carray<double> s({B, m});
  std::vector<double> work(5 * static_cast<std::size_t>(m));
  for (py::ssize_t b = 0; b < B; ++b)
    tridiagonal_eigenvector(static_cast<int>(m), d.data() + b * m, e.data() + b * m,
                            theta.data()[b], s.mutable_data() + b * m, work.data());
  return s;
}

// tridiagonal_eigh (engine/tridiagonal.hpp) on B matrices of order m, one
// per row of d and e: eigenvalues (B, m), eigenvector rows first_row ..
// first_row + rows - 1 (B, rows, m) and ok (B,). lanes = true runs the rows in
// lane blocks (the last block padded with zero matrices), as the lockstep
// Lanczos convergence tests do; false, one matrix at a time. For tests.
py::tuple tridiagonal_eigh_rows(const carray<double>& d, const carray<double>& e,
                                int first_row, int rows, bool lanes) {
  require(d.ndim() == 2 && e.ndim() == 2 && d.shape(0) == e.shape(0) &&
              d.shape(1) == e.shape(1),
          "d and e must both have shape (B, m)");
  const py::ssize_t B = d.shape(0);
  const int m = static_cast<int>(d.shape(1));
  require(first_row >= 0 && rows >= 0 && first_row + rows <= m,
          "rows first_row .. first_row + rows - 1 must lie in [0, m)");
  carray<double> evals({B, static_cast<py::ssize_t>(m)});
  carray<double> Z({B, static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(m)});
  flags ok(B);
  const double *dp = d.data(), *ep = e.data();
  double *vp = evals.mutable_data(), *zp = Z.mutable_data();
  std::uint8_t* okp = ok.mutable_data();
  if (!lanes) {
    std::vector<double> ework(m);
    for (py::ssize_t b = 0; b < B; ++b) {
      std::copy(dp + b * m, dp + (b + 1) * m, vp + b * m);
      std::copy(ep + b * m, ep + (b + 1) * m, ework.begin());
      okp[b] = tridiagonal_eigh(m, vp + b * m, ework.data(), zp + b * rows * m, first_row, rows);
    }
    return py::make_tuple(evals, Z, ok);
  }
  constexpr int L = kNativeLanes<double>;
  using V = Lanes<double, L>;
  std::vector<V> dv(m), ev(m), zv(static_cast<std::size_t>(rows) * m);
  for (py::ssize_t b0 = 0; b0 < B; b0 += L) {
    for (int i = 0; i < m; ++i)
      for (int l = 0; l < L; ++l) {
        const bool in = b0 + l < B;
        set_lane(dv[i], l, in ? dp[(b0 + l) * m + i] : 0.0);
        set_lane(ev[i], l, in ? ep[(b0 + l) * m + i] : 0.0);
      }
    const mask_t<V> good = tridiagonal_eigh(m, dv.data(), ev.data(), zv.data(), first_row, rows);
    for (int l = 0; l < L && b0 + l < B; ++l) {
      const py::ssize_t b = b0 + l;
      okp[b] = lane(good, l);
      for (int i = 0; i < m; ++i) vp[b * m + i] = lane(dv[i], l);
      for (int r = 0; r < rows * m; ++r) zp[b * rows * m + r] = lane(zv[r], l);
    }
  }
  return py::make_tuple(evals, Z, ok);
}

// tridiagonal_top_test (engine/tridiagonal.hpp) on B matrices of order m, one
// per row of d and e, in Real: theta, z, norm and ok, each (B,). lanes = true
// runs lane blocks (the last one padded with a matrix of unit couplings), as
// the lockstep Lanczos convergence tests do; false, one matrix at a time. For
// tests.
template <class Real>
py::tuple tridiagonal_top_test_rows(const carray<Real>& d, const carray<Real>& e, bool lanes) {
  require(d.ndim() == 2 && e.ndim() == 2 && d.shape(0) == e.shape(0) &&
              d.shape(1) == e.shape(1) && d.shape(1) >= 1,
          "d and e must both have shape (B, m), m >= 1");
  const py::ssize_t B = d.shape(0);
  const int m = static_cast<int>(d.shape(1));
  carray<Real> theta(B), z(B), norm(B);
  flags ok(B);
  auto run = [&](auto lane_type, py::ssize_t b0) {
    using V = decltype(lane_type);
    constexpr int L = lane_width<V>;
    std::vector<V> a(m), c(m), work(2 * static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i)
      for (int l = 0; l < L; ++l) {
        const bool in = b0 + l < B;
        set_lane(a[i], l, in ? d.data()[(b0 + l) * m + i] : Real(0));
        set_lane(c[i], l, in ? e.data()[(b0 + l) * m + i] : Real(1));
      }
    V t, zz, nn;
    const mask_t<V> good = tridiagonal_top_test(m, a.data(), c.data(), &t, &zz, &nn, work.data());
    for (int l = 0; l < L && b0 + l < B; ++l) {
      theta.mutable_data()[b0 + l] = lane(t, l);
      z.mutable_data()[b0 + l] = lane(zz, l);
      norm.mutable_data()[b0 + l] = lane(nn, l);
      ok.mutable_data()[b0 + l] = lane(good, l);
    }
  };
  constexpr int L = kNativeLanes<Real>;
  for (py::ssize_t b0 = 0; b0 < B; b0 += lanes ? L : 1) {
    if (lanes)
      run(Lanes<Real, L>(), b0);
    else
      run(Real(0), b0);
  }
  return py::make_tuple(theta, z, norm, ok);
}

// exp_, log_, tanh_, expm1_, log1p_, sin_ or cos_ of each element in lane blocks of doubles (core/lane_math.hpp),
// the engine's own code path, for the accuracy tests (tests/csrc/test_lane_math.py).
carray<double> lane_math(const std::string& name, const carray<double>& x) {
  const char* names[] = {"exp", "log", "tanh", "expm1", "log1p", "sin", "cos"};
  int fn = -1;
  for (int i = 0; i < 7; ++i)
    if (name == names[i]) fn = i;
  require(fn >= 0, "name must be 'exp', 'log', 'tanh', 'expm1', 'log1p', 'sin' or 'cos'");
  constexpr int L = kNativeLanes<double>;
  const py::ssize_t n = x.size();
  carray<double> out(n);
  const double* in = x.data();
  double* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (py::ssize_t i0 = 0; i0 < n; i0 += L) {
      Lanes<double, L> v(0.0);
      for (int l = 0; l < L && i0 + l < n; ++l) v.set(l, in[i0 + l]);
      const Lanes<double, L> r = fn == 0   ? exp_(v)
                                 : fn == 1 ? log_(v)
                                 : fn == 2 ? tanh_(v)
                                 : fn == 3 ? expm1_(v)
                                 : fn == 4 ? log1p_(v)
                                 : fn == 5 ? sin_(v)
                                           : cos_(v);
      for (int l = 0; l < L && i0 + l < n; ++l) o[i0 + l] = r[l];
    }
  }
  return out;
}

// BN linear regression's batched loss and gradient through one named driver, "rows"
// (cpu/bn_linreg_rows.hpp, whatever its `pays` says) or "lanes" (cpu/batched.hpp), for the
// test that they agree bit for bit (tests/csrc/test_bn_linreg_rows.py).
template <class Real>
py::tuple bn_linreg_loss_grad_path(const std::string& path, const carray<Real>& Xc,
                                   const carray<Real>& u, double scale, const carray<Real>& W) {
  require(path == "rows" || path == "lanes", "path must be 'rows' or 'lanes'");
  require(Xc.ndim() == 2 && u.ndim() == 1 && u.shape(0) == Xc.shape(0) && W.ndim() == 2 &&
              W.shape(1) == Xc.shape(1),
          "Xc must be (n, d), u (n,) and W (B, d)");
  const int n = static_cast<int>(Xc.shape(0)), d = static_cast<int>(Xc.shape(1));
  Real fro2 = Real(0);
  for (py::ssize_t k = 0; k < Xc.size(); ++k) fro2 += Xc.data()[k] * Xc.data()[k];
  const BNLinearRegression<Real> model{Xc.data(), u.data(), Real(scale), fro2, n, d};
  const py::ssize_t B = W.shape(0);
  carray<Real> loss(B), G({B, static_cast<py::ssize_t>(d)});
  py::array_t<std::uint8_t> ok(B);
  {
    py::gil_scoped_release release;
    if (path == "rows")
      cpu::loss_grad_rows(model, W.data(), B, loss.mutable_data(), G.mutable_data(),
                          ok.mutable_data());
    else
      cpu::loss_grad_lanes(model, W.data(), B, loss.mutable_data(), G.mutable_data(),
                           ok.mutable_data());
  }
  return py::make_tuple(loss, G, ok);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "pysharp compiled core: batched model kernels (see pysharp.models).";
#ifdef PYSHARP_VERSION
  m.attr("__version__") = PYSHARP_VERSION;  // the build's (SKBUILD_PROJECT_VERSION)
#else
  m.attr("__version__") = "0+unknown";
#endif
  bind_models_f64(m);  // the units of holders.hpp, compiled in parallel
  bind_models_f32(m);
  m.def("lanczos_callable", &lanczos_callable, py::arg("matvec"), py::arg("dim"),
        py::arg("options"), py::arg("start") = py::none());
  m.def("_tridiagonal_eigh", &tridiagonal_eigh_rows, py::arg("d"), py::arg("e"),
        py::arg("first_row"), py::arg("rows"), py::arg("lanes"));
  m.def("_tridiagonal_eigenvectors", &tridiagonal_eigenvectors, py::arg("d"), py::arg("e"),
        py::arg("theta"));
  m.def("_tridiagonal_top_test", &tridiagonal_top_test_rows<double>, py::arg("d"),
        py::arg("e"), py::arg("lanes"));
  m.def("_tridiagonal_top_test_f32", &tridiagonal_top_test_rows<float>, py::arg("d"),
        py::arg("e"), py::arg("lanes"));
  m.def("_lane_math", &lane_math, py::arg("name"), py::arg("x"));
  m.def("_bn_linreg_loss_grad_path", &bn_linreg_loss_grad_path<double>, py::arg("path"),
        py::arg("Xc"), py::arg("u"), py::arg("scale"), py::arg("W"));
  m.def("_bn_linreg_loss_grad_path_f32", &bn_linreg_loss_grad_path<float>, py::arg("path"),
        py::arg("Xc"), py::arg("u"), py::arg("scale"), py::arg("W"));
  // the scale-invariant built-ins (builtin_models.hpp), whose classes the CuPy backend
  // mirrors on the device
#define PYSHARP_MODEL_NAME(Model) #Model,
  m.attr("BUILTIN_MODELS") =
      py::tuple(py::cast(std::vector<std::string>{PYSHARP_BUILTIN_MODELS(PYSHARP_MODEL_NAME)}));
#undef PYSHARP_MODEL_NAME
  m.attr("LANCZOS_MAX_ITER") = kLanczosMaxIter;  // Krylov dimension cap of one solve
  m.attr("METHODS") = module::method_names();
  m.attr("RECORDS") = module::record_table<double>();
  py::dict safe;  // kernels mark rows outside these squared norms ok = 2 (cpu/batched.hpp)
  safe["float64"] = py::make_tuple(SafeNorm2<double>::lo, SafeNorm2<double>::hi);
  safe["float32"] = py::make_tuple(double(SafeNorm2<float>::lo),
                                   double(SafeNorm2<float>::hi));
  m.attr("SAFE_NORM2") = safe;

  m.def("build_info", []() {
    py::dict info;
#ifdef _OPENMP
    info["openmp"] = true;
#else
    info["openmp"] = false;
#endif
#ifdef PYSHARP_WITH_CUDA_MODULE
    info["cuda"] = true;  // pysharp._cuda was built beside this module
#else
    info["cuda"] = false;
#endif
#ifdef PYSHARP_NATIVE
    info["native"] = true;
#else
    info["native"] = false;
#endif
    // The instruction set the lane blocks were compiled for (the -march of the build).
#if defined(__AVX512F__)
    info["simd"] = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    info["simd"] = "avx2-fma";
#elif defined(__AVX__)
    info["simd"] = "avx";
#elif defined(__ARM_NEON)
    info["simd"] = "neon";
#elif defined(__SSE2__)
    info["simd"] = "sse2";
#else
    info["simd"] = "scalar";
#endif
    info["lanes_f64"] = kNativeLanes<double>;
    info["simd_registers"] = kSimdRegisters;
    info["compiler"] = std::string(__VERSION__);
    return info;
  });
  m.def("max_threads", []() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
  });
  m.def(
      "set_num_threads",
      [](int n) {
        require(n >= 1, "num_threads must be >= 1");
#ifdef _OPENMP
        omp_set_num_threads(n);
#endif
      },
      py::arg("n"));

  // -- SGD linear stability: square-loss models, SGD engine, linearised SGD --
  bind_stability(m);
  bind_spectra(m);  // Hessian spectra
  bind_loaded(m);   // the tables of run-time compiled models
  bind_tile(m);     // _tile_*: the GPU engine's tiles on an emulated warp (tests)
}
