// pybind11 module pysharp._core: thin wrappers over the batched drivers.
//
// Arguments arrive already validated by the Python layer (pysharp/_validation.py);
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
#include <type_traits>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/bind_cpu.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/bn_two_layer_net.hpp"
#include "pysharp/models/toy3d.hpp"

namespace py = pybind11;
using namespace pysharp;

using module::carray;
using module::flags;

namespace {

template <class T>
std::vector<T> to_vector(const carray<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

using module::checked_batch;
using module::require;

// Owners keep the model's arrays alive; the model itself is a view of them
// (the same POD struct a CUDA kernel receives).
template <class Real>
struct BNLinRegCore {
  std::vector<Real> Xc, u, sigma, inv_sigma, sigma2, ut, V;
  BNLinearRegression<Real> model;
  BNLinRegSpectral<Real> spectral;  // the reduced form used by the engine
  BNLinRegCore(const carray<Real>& Xc_, const carray<Real>& u_, double scale,
               const carray<Real>& sigma_, const carray<Real>& ut_, const carray<Real>& V_,
               double uperp2)
      : Xc(to_vector(Xc_)), u(to_vector(u_)), sigma(to_vector(sigma_)), ut(to_vector(ut_)),
        V(to_vector(V_)) {
    require(Xc_.ndim() == 2 && u_.ndim() == 1 && u_.shape(0) == Xc_.shape(0),
            "Xc must be (n, d) and u (n,)");
    const int n = static_cast<int>(Xc_.shape(0)), d = static_cast<int>(Xc_.shape(1));
    const int r = static_cast<int>(sigma.size());
    require(r >= 1 && ut.size() == sigma.size() && V_.ndim() == 2 && V_.shape(0) == d &&
                V_.shape(1) == r,
            "sigma and ut must be (r,), V (d, r)");
    for (Real sv : sigma) {
      require(sv > Real(0), "sigma must be positive");
      inv_sigma.push_back(Real(1) / sv);
      sigma2.push_back(sv * sv);
    }
    double fro2 = 0;
    for (Real x : Xc) fro2 += double(x) * double(x);
    model = {Xc.data(), u.data(), static_cast<Real>(scale), static_cast<Real>(fro2), n, d};
    spectral = {sigma.data(), inv_sigma.data(), sigma2.data(), ut.data(), V.data(),
                static_cast<Real>(uperp2), static_cast<Real>(fro2),
                static_cast<Real>(scale), r, d};
  }
  BNLinRegCore(const BNLinRegCore&) = delete;
};

template <class Real>
struct BNMatrixCompletionCore {
  std::vector<int> rows, cols;
  std::vector<Real> u;
  BNMatrixCompletion<Real> model;
  BNMatrixCompletionCore(const carray<int>& rows_, const carray<int>& cols_,
                         const carray<Real>& u_, double scale, int m1, int m2, int r)
      : rows(to_vector(rows_)), cols(to_vector(cols_)), u(to_vector(u_)) {
    require(rows.size() == u.size() && cols.size() == u.size(),
            "rows, cols and u must have one entry per observation");
    for (std::size_t k = 0; k < rows.size(); ++k)
      require(rows[k] >= 0 && rows[k] < m1 && cols[k] >= 0 && cols[k] < m2,
              "observation index out of range");
    model = {rows.data(), cols.data(), u.data(), static_cast<Real>(scale),
             static_cast<int>(u.size()), m1, m2, r};
  }
  BNMatrixCompletionCore(const BNMatrixCompletionCore&) = delete;
};

template <class Real>
struct BNTwoLayerNetCore {
  std::vector<Real> Xc, y;
  BNTwoLayerNet<Real> model;
  BNTwoLayerNetCore(const carray<Real>& Xc_, const carray<Real>& y_, int width, int activation)
      : Xc(to_vector(Xc_)), y(to_vector(y_)) {
    require(Xc_.ndim() == 2 && y_.ndim() == 1 && y_.shape(0) == Xc_.shape(0),
            "Xc must be (n, d) and y (n,)");
    require(width >= 1 && (activation == 0 || activation == 1),
            "width must be >= 1 and activation 0 (tanh) or 1 (relu)");
    double fro2 = 0;
    for (Real x : Xc) fro2 += double(x) * double(x);
    model = {Xc.data(), y.data(), static_cast<Real>(fro2),
             static_cast<Real>(1 / std::sqrt(double(width))), static_cast<int>(Xc_.shape(0)),
             static_cast<int>(Xc_.shape(1)), width, static_cast<Activation>(activation)};
  }
  BNTwoLayerNetCore(const BNTwoLayerNetCore&) = delete;
};

template <class Real>
struct Toy3DCore {
  Toy3D<Real> model;
  explicit Toy3DCore(double c) : model{static_cast<Real>(c)} {}
};

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

template <class Real>
void bind_dtype(py::module_& m, const std::string& suffix) {
  py::class_<BNLinRegCore<Real>> linreg(m, ("BNLinearRegression" + suffix).c_str());
  module::def_init_BNLinearRegression<Real>(linreg);
  module::bind_cpu_model<BNLinRegCore<Real>, Real>(linreg);

  using MC = BNMatrixCompletionCore<Real>;
  py::class_<MC> mc(m, ("BNMatrixCompletion" + suffix).c_str());
  module::def_init_BNMatrixCompletion<Real>(mc);
  module::bind_cpu_model<MC, Real>(mc);
  mc.def(
      "test_loss",
      [](const MC& c, const carray<Real>& W, const carray<int>& rows,
         const carray<int>& cols, const carray<Real>& values, double value_mean,
         double value_std) {
        const std::int64_t B = checked_batch(c, W, "W");
        const int Nt = static_cast<int>(values.size());
        require(rows.size() == Nt && cols.size() == Nt,
                "rows, cols and values must have one entry per held-out observation");
        for (int k = 0; k < Nt; ++k)
          require(rows.data()[k] >= 0 && rows.data()[k] < c.model.m1 &&
                      cols.data()[k] >= 0 && cols.data()[k] < c.model.m2,
                  "held-out index out of range");
        carray<Real> loss(B);
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          const std::int64_t D = c.model.dim();
#pragma omp parallel
          {
            std::vector<Real> work(std::max(c.model.N, Nt) + 1);
#pragma omp for schedule(static)
            for (std::int64_t b = 0; b < B; ++b)
              ok.mutable_data()[b] = bn_mc_test_loss(
                  c.model, W.data() + b * D, rows.data(), cols.data(), values.data(), Nt,
                  static_cast<Real>(value_mean), static_cast<Real>(value_std),
                  loss.mutable_data() + b, work.data());
          }
        }
        return py::make_tuple(loss, ok);
      },
      py::arg("W"), py::arg("rows"), py::arg("cols"), py::arg("values"),
      py::arg("value_mean"), py::arg("value_std"));

  using BN2 = BNTwoLayerNetCore<Real>;
  py::class_<BN2> bn2(m, ("BNTwoLayerNet" + suffix).c_str());
  module::def_init_BNTwoLayerNet<Real>(bn2);
  module::bind_cpu_model<BN2, Real>(bn2);

  py::class_<Toy3DCore<Real>> toy(m, ("Toy3D" + suffix).c_str());
  module::def_init_Toy3D<Real>(toy);
  module::bind_cpu_model<Toy3DCore<Real>, Real>(toy);
}

}  // namespace

#include "bindings_stability.hpp"  // SGD linear stability (issue 7)
#include "bindings_spectra.hpp"    // Hessian spectra: SLQ (issue 14)

PYBIND11_MODULE(_core, m) {
  m.doc() = "pysharp compiled core: batched model kernels (see pysharp.models).";
  bind_dtype<double>(m, "_f64");
  bind_dtype<float>(m, "_f32");
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
  m.attr("METHODS") = module::method_names();
  py::dict safe;  // kernels mark rows outside these squared norms ok = 2 (cpu/batched.hpp)
  safe["float64"] = py::make_tuple(cpu::SafeNorm2<double>::lo, cpu::SafeNorm2<double>::hi);
  safe["float32"] = py::make_tuple(double(cpu::SafeNorm2<float>::lo),
                                   double(cpu::SafeNorm2<float>::hi));
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
  bind_spectra(m);  // Hessian spectra (issue 14)
}
