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

#include "cpu/batched.hpp"
#include "cpu/engine.hpp"
#include "module_options.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/bn_two_layer_net.hpp"
#include "pysharp/models/toy3d.hpp"

namespace py = pybind11;
using namespace pysharp;

template <class T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;
using flags = py::array_t<std::uint8_t>;

namespace {

template <class T>
std::vector<T> to_vector(const carray<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}

using module::lanczos_options;
using module::require;

template <class Real>
carray<Real> optional_output(bool wanted, std::vector<py::ssize_t> shape) {
  if (!wanted)
    for (auto& s : shape) s = 0;
  return carray<Real>(shape);
}

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

template <class Core>
std::int64_t checked_batch(const Core& core, const py::array& W, const char* name) {
  require(W.ndim() == 2 && W.shape(1) == core.model.dim(),
          std::string(name) + " must be (B, " + std::to_string(core.model.dim()) + ")");
  return W.shape(0);
}

template <class Core, class Real>
void add_kernels(py::class_<Core>& cls) {
  cls.def_property_readonly("dim", [](const Core& c) { return c.model.dim(); });
  cls.def(
      "loss_grad",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t B = checked_batch(c, W, "W");
        carray<Real> loss(B), G({B, static_cast<std::int64_t>(c.model.dim())});
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          cpu::loss_grad(c.model, W.data(), B, loss.mutable_data(), G.mutable_data(),
                         ok.mutable_data());
        }
        return py::make_tuple(loss, G, ok);
      },
      py::arg("W"), "(B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)");
  auto directional = [](auto order) {
    return [](const Core& c, const carray<Real>& W, const carray<Real>& V) {
      const std::int64_t B = checked_batch(c, W, "W");
      require(checked_batch(c, V, "V") == B, "W and V must have the same shape");
      carray<Real> out({B, static_cast<std::int64_t>(c.model.dim())});
      flags ok(B);
      {
        py::gil_scoped_release nogil;
        cpu::directional<decltype(order)::value>(c.model, W.data(), V.data(), B,
                                                 out.mutable_data(), ok.mutable_data());
      }
      return py::make_tuple(out, ok);
    };
  };
  cls.def("hvp", directional(std::integral_constant<int, 1>{}), py::arg("W"),
          py::arg("V"), "(B, D), (B, D) -> (H v (B, D), ok (B,))");
  cls.def("third", directional(std::integral_constant<int, 2>{}), py::arg("W"),
          py::arg("V"), "(B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))");
  cls.def(
      "hessian",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t B = checked_batch(c, W, "W");
        const std::int64_t D = c.model.dim();
        carray<Real> H({B, D, D});
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          cpu::hessian(c.model, W.data(), B, H.mutable_data(), ok.mutable_data());
        }
        return py::make_tuple(H, ok);
      },
      py::arg("W"), "(B, D) -> (H (B, D, D), ok (B,))");
}

template <class Core, class Real>
void add_engine(py::class_<Core>& cls) {
  cls.def(
      "run",
      [](const Core& c, const carray<Real>& W0, const carray<Real>& lr, const carray<Real>& wd,
         int method, long long steps, long long record_every, long long sharpness_every,
         long long theta_every, double jitter, std::uint64_t seed, long long offset,
         double rms_beta, double rms_eps, int lanczos_max_iter, int lanczos_min_iter,
         double lanczos_tol, bool reduced) {
        const std::int64_t B = checked_batch(c, W0, "w0");
        const int D = c.model.dim();
        require(lr.size() == B && wd.size() == B, "lr and wd must have one entry per trajectory");
        constexpr bool has_reduced = std::is_same_v<Core, BNLinRegCore<Real>>;
        const EngineConfig cfg = module::engine_config(
            D, method, steps, record_every, sharpness_every, theta_every, jitter, seed, rms_beta,
            rms_eps, lanczos_max_iter, lanczos_min_iter, lanczos_tol, reduced, has_reduced);
        const py::ssize_t nrec = n_records(steps, record_every);
        const py::ssize_t nsh = n_records(steps, sharpness_every);
        const py::ssize_t nth = n_records(steps, theta_every);
        const bool sharp = sharpness_every > 0;
        carray<Real> loss({nrec, (py::ssize_t)B}), norm2({nrec, (py::ssize_t)B}),
            eff_lr({nrec, (py::ssize_t)B}), grad_norm({nrec, (py::ssize_t)B});
        auto top_grad = optional_output<Real>(sharp, {nrec, (py::ssize_t)B});
        carray<Real> sharpness({nsh, (py::ssize_t)B}), eos_ratio({nsh, (py::ssize_t)B});
        flags sh_conv({nsh, (py::ssize_t)B});
        carray<Real> theta({nth, (py::ssize_t)B, (py::ssize_t)D});
        carray<Real> w({(py::ssize_t)B, (py::ssize_t)D});
        flags diverged(B);
        py::array_t<long long> diverged_step(B);
        const int G = n_groups(c.model);
        carray<Real> group_norm2({G > 1 ? nrec : 0, (py::ssize_t)B, (py::ssize_t)G});
        BatchRecords<Real> out{loss.mutable_data(), norm2.mutable_data(),
                                    eff_lr.mutable_data(), grad_norm.mutable_data(),
                                    sharp ? top_grad.mutable_data() : nullptr,
                                    sharpness.mutable_data(), eos_ratio.mutable_data(),
                                    sh_conv.mutable_data(),
                                    nth ? theta.mutable_data() : nullptr, w.mutable_data(),
                                    diverged.mutable_data(), diverged_step.mutable_data(),
                                    G > 1 ? group_norm2.mutable_data() : nullptr, G};
        {
          py::gil_scoped_release nogil;
          if constexpr (has_reduced) {
            if (reduced) {
              cpu::run_batch_spectral(c.model, c.spectral, cfg, W0.data(), lr.data(), wd.data(),
                                      B, offset, out);
            } else {
              cpu::run_batch(c.model, cfg, W0.data(), lr.data(), wd.data(), B, offset, out);
            }
          } else {
            cpu::run_batch(c.model, cfg, W0.data(), lr.data(), wd.data(), B, offset, out);
          }
        }
        py::dict r;
        r["loss"] = loss;
        r["norm2"] = norm2;
        r["eff_lr"] = eff_lr;
        r["grad_norm"] = grad_norm;
        r["top_grad"] = top_grad;
        r["sharpness"] = sharpness;
        r["eos_ratio"] = eos_ratio;
        r["sharpness_converged"] = sh_conv;
        r["theta"] = theta;
        r["w"] = w;
        r["diverged"] = diverged;
        r["diverged_step"] = diverged_step;
        if (G > 1) r["group_norm2"] = group_norm2;
        return r;
      },
      py::arg("w0"), py::arg("lr"), py::arg("wd"), py::arg("method"), py::arg("steps"),
      py::arg("record_every"), py::arg("sharpness_every"), py::arg("theta_every"),
      py::arg("jitter"), py::arg("seed"), py::arg("offset"), py::arg("rms_beta"),
      py::arg("rms_eps"), py::arg("lanczos_max_iter"), py::arg("lanczos_min_iter"),
      py::arg("lanczos_tol"), py::arg("reduced") = false);
  cls.def(
      "lanczos",
      [](const Core& c, const carray<Real>& W, int k, int max_iter, int min_iter, double tol,
         std::uint64_t seed, std::optional<carray<Real>> start, bool smallest) {
        const std::int64_t B = checked_batch(c, W, "W");
        const int D = c.model.dim();
        const LanczosOptions o = lanczos_options(D, k, max_iter, min_iter, tol, seed, smallest);
        if (start) require(checked_batch(c, *start, "start") == B, "start must match W");
        carray<Real> evals({(py::ssize_t)B, (py::ssize_t)k}),
            evecs({(py::ssize_t)B, (py::ssize_t)k, (py::ssize_t)D}),
            resid({(py::ssize_t)B, (py::ssize_t)k});
        py::array_t<int> iters(B);
        flags conv(B), ok(B);
        {
          py::gil_scoped_release nogil;
          cpu::lanczos_batch(c.model, o, W.data(), start ? start->data() : nullptr, B,
                             evals.mutable_data(), evecs.mutable_data(), resid.mutable_data(),
                             iters.mutable_data(), conv.mutable_data(), ok.mutable_data());
        }
        return py::make_tuple(evals, evecs, resid, iters, conv, ok);
      },
      py::arg("W"), py::arg("k"), py::arg("max_iter"), py::arg("min_iter"), py::arg("tol"),
      py::arg("seed"), py::arg("start") = py::none(), py::arg("smallest") = false);
}

// Lanczos on a Python callable: the same C++ recurrence, the GIL held while
// the callable runs. Its result is anything numpy.asarray accepts.
py::tuple lanczos_callable(const py::function& matvec, int D, int k, int max_iter, int min_iter,
                           double tol, std::uint64_t seed, std::optional<carray<double>> start,
                           bool smallest) {
  const LanczosOptions o = lanczos_options(D, k, max_iter, min_iter, tol, seed, smallest);
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

template <class Real>
void bind_dtype(py::module_& m, const std::string& suffix) {
  py::class_<BNLinRegCore<Real>> linreg(m, ("BNLinearRegression" + suffix).c_str());
  linreg.def(py::init<const carray<Real>&, const carray<Real>&, double, const carray<Real>&,
                      const carray<Real>&, const carray<Real>&, double>(),
             py::arg("Xc"), py::arg("u"), py::arg("scale"), py::arg("sigma"), py::arg("ut"),
             py::arg("V"), py::arg("uperp2"));
  add_kernels<BNLinRegCore<Real>, Real>(linreg);
  add_engine<BNLinRegCore<Real>, Real>(linreg);

  using MC = BNMatrixCompletionCore<Real>;
  py::class_<MC> mc(m, ("BNMatrixCompletion" + suffix).c_str());
  mc.def(py::init<const carray<int>&, const carray<int>&, const carray<Real>&, double,
                  int, int, int>(),
         py::arg("rows"), py::arg("cols"), py::arg("u"), py::arg("scale"), py::arg("m1"),
         py::arg("m2"), py::arg("rank"));
  add_kernels<MC, Real>(mc);
  add_engine<MC, Real>(mc);
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
  bn2.def(py::init<const carray<Real>&, const carray<Real>&, int, int>(), py::arg("Xc"),
          py::arg("y"), py::arg("width"), py::arg("activation"));
  add_kernels<BN2, Real>(bn2);
  add_engine<BN2, Real>(bn2);

  py::class_<Toy3DCore<Real>> toy(m, ("Toy3D" + suffix).c_str());
  toy.def(py::init<double>(), py::arg("c"));
  add_kernels<Toy3DCore<Real>, Real>(toy);
  add_engine<Toy3DCore<Real>, Real>(toy);
}

}  // namespace

#include "bindings_stability.hpp"  // SGD linear stability (issue 7)
#include "bindings_spectra.hpp"    // Hessian spectra: SLQ (issue 14)

PYBIND11_MODULE(_core, m) {
  m.doc() = "pysharp compiled core: batched model kernels (see pysharp.models).";
  bind_dtype<double>(m, "_f64");
  bind_dtype<float>(m, "_f32");
  m.def("lanczos_callable", &lanczos_callable, py::arg("matvec"), py::arg("dim"), py::arg("k"),
        py::arg("max_iter"), py::arg("min_iter"), py::arg("tol"), py::arg("seed"),
        py::arg("start") = py::none(), py::arg("smallest") = false);

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
