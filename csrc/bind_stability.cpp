// Bindings for the SGD linear-stability part of pysharp._core: square-loss
// models, the SGD engine, linearised-SGD moment runs.
#include <cmath>

#include "cpu/bind_square_loss.hpp"
#include "holders.hpp"
#include "cpu/threads.hpp"

namespace pysharp::module {
namespace {

using namespace pybind11::literals;

// The fields of a built-in square-loss model: its own copies of X and y, and the scalars.
template <class Real>
py::dict square_loss_fields(const carray<Real>& X, const carray<Real>& y, py::dict f) {
  require(X.ndim() == 2 && y.ndim() == 1 && y.shape(0) == X.shape(0),
          "X must be (n, d) and y (n,)");
  f["X"] = X.attr("copy")();
  f["y"] = y.attr("copy")();
  return f;
}

template <class Real>
void bind_stability_dtype(py::module_& m, const std::string& suffix) {
  py::class_<LinearRegressionCore<Real>> lr(m, ("LinearRegression" + suffix).c_str());
  lr.def(py::init([](const carray<Real>& X, const carray<Real>& y, bool bias) {
           return new LinearRegressionCore<Real>(square_loss_fields(X, y, py::dict("bias"_a = bias ? 1 : 0)));
         }),
         py::arg("X"), py::arg("y"), py::arg("bias"));
  module::bind_kernels<module::CpuExec, LinearRegressionCore<Real>, Real>(lr);
  add_square_loss<module::CpuExec, LinearRegressionCore<Real>, Real>(lr);

  py::class_<TwoLayerNetCore<Real>> net(m, ("TwoLayerNet" + suffix).c_str());
  net.def(py::init([](const carray<Real>& X, const carray<Real>& y, int width, int activation) {
            require(width >= 1, "width must be >= 1");
            require(activation == 0 || activation == 1, "unknown activation");
            return new TwoLayerNetCore<Real>(square_loss_fields(
                X, y,
                py::dict("m"_a = width, "act"_a = activation,
                         "inv_sqrt_m"_a = 1.0 / std::sqrt(double(width)))));
          }),
          py::arg("X"), py::arg("y"), py::arg("width"), py::arg("activation"));
  module::bind_kernels<module::CpuExec, TwoLayerNetCore<Real>, Real>(net);
  add_square_loss<module::CpuExec, TwoLayerNetCore<Real>, Real>(net);

  m.def(
      "bn_linreg_jacobians",
      [](const BNLinearRegressionCore<Real>& c, const carray<Real>& W) {
        const std::int64_t P = checked_batch(c, W, "W");
        const py::ssize_t n = c.model.n, d = c.model.d;
        carray<Real> A({(py::ssize_t)P, n, d}), GX({(py::ssize_t)P, n, d});
        flags ok(P);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          cpu::bn_jacobians(c.model, W.data(), P, A.mutable_data(), GX.mutable_data(),
                            ok.mutable_data());
        }
        return py::make_tuple(A, GX, ok);
      },
      py::arg("core"), py::arg("W"), "(P, d) -> (grad_w p (P, n, d), grad_x p (P, n, d), ok (P,))");
  m.def(
      "bn_linreg_sgd",
      [](const BNLinearRegressionCore<Real>& c, const carray<Real>& W0, const carray<Real>& lr,
         const carray<int>& batch, const carray<Real>& wd, long long steps,
         long long record_every, bool replacement, std::uint64_t seed, long long offset,
         double max_loss) {
        return sgd_call<module::CpuExec>(c, W0, lr, batch, wd, steps, record_every,
                                         replacement, seed, offset, max_loss);
      },
      py::arg("core"), py::arg("w0"), py::arg("lr"), py::arg("batch"), py::arg("wd"),
      py::arg("steps"), py::arg("record_every"), py::arg("replacement"), py::arg("seed"),
      py::arg("offset"), py::arg("max_loss"),
      "Mini-batch SGD+WD with ghost BN (each batch's own statistics) on BN linear regression");
  m.def(
      "bn_linreg_batch_loss_grad",
      [](const BNLinearRegressionCore<Real>& c, const carray<Real>& W, const carray<int>& idx) {
        const std::int64_t P = checked_batch(c, W, "W");
        const int n = c.model.n, d = c.model.d;
        require(idx.ndim() == 1 && idx.shape(0) >= 2, "batch must be 1-D with >= 2 indices");
        const int B = static_cast<int>(idx.shape(0));
        for (int k = 0; k < B; ++k)
          require(idx.data()[k] >= 0 && idx.data()[k] < n, "batch index out of range");
        carray<Real> loss(P), G({(py::ssize_t)P, (py::ssize_t)d});
        flags ok(P);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          std::vector<Real> work(2 * static_cast<std::size_t>(B));
          for (std::int64_t p = 0; p < P; ++p)
            ok.mutable_data()[p] = c.model.batch_loss_grad(
                W.data() + p * d, idx.data(), B, loss.mutable_data() + p,
                G.mutable_data() + p * d, work.data());
        }
        return py::make_tuple(loss, G, ok);
      },
      py::arg("core"), py::arg("W"), py::arg("idx"),
      "Ghost-BN loss and gradient of batch idx (B,): (L_I (P,), grad L_I (P, d), ok (P,))");
}

}  // namespace

void bind_stability(py::module_& m) {
  bind_stability_dtype<double>(m, "_f64");
  bind_stability_dtype<float>(m, "_f32");
  m.def(
      "linear_sgd",
      [](const carray<double>& A, const carray<double>& X0, double lr, int batch,
         bool replacement, std::uint64_t seed, long long offset, long long t0, long long steps) {
        require(A.ndim() == 2 && A.shape(0) >= 1 && A.shape(1) >= 1, "A must be (n, D)");
        const int n = static_cast<int>(A.shape(0)), D = static_cast<int>(A.shape(1));
        require(X0.ndim() == 2 && X0.shape(1) == D, "X0 must be (runs, D)");
        require(batch >= 1 && (replacement || batch <= n), "batch must be in [1, n]");
        require(steps >= 0 && t0 >= 0, "steps >= 0 and t0 >= 0");
        const py::ssize_t R = X0.shape(0);
        carray<double> X({R, (py::ssize_t)D});
        std::copy(X0.data(), X0.data() + X0.size(), X.mutable_data());
        carray<double> logg(R);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          cpu::linear_sgd_batch(A.data(), n, D, lr, batch, replacement, seed, R, offset, t0,
                                steps, X.mutable_data(), logg.mutable_data());
        }
        return py::make_tuple(X, logg);
      },
      py::arg("A"), py::arg("X0"), py::arg("lr"), py::arg("batch"), py::arg("replacement"),
      py::arg("seed"), py::arg("offset"), py::arg("t0"), py::arg("steps"),
      "Linearised SGD x <- x - (lr/B) sum_I a_i a_i.x for steps t0.. of each run: "
      "(unit final states (runs, D), log growth (runs,))");
  m.def(
      "sgd_batches",
      [](int n, int batch, bool replacement, std::uint64_t seed, long long trajectory,
         long long steps) {
        require(n >= 1 && batch >= 1 && (replacement || batch <= n) && steps >= 0,
                "need n >= 1, batch in [1, n] (>= 1 with replacement), steps >= 0");
        py::array_t<int> idx({(py::ssize_t)steps, (py::ssize_t)batch});
        std::vector<int> perm(n);
        for (int i = 0; i < n; ++i) perm[i] = i;
        for (long long t = 0; t < steps; ++t)
          draw_batch(seed, static_cast<std::uint64_t>(trajectory), static_cast<std::uint64_t>(t),
                     n, batch, replacement, perm.data(), idx.mutable_data() + t * batch);
        return idx;
      },
      py::arg("n"), py::arg("batch"), py::arg("replacement"), py::arg("seed"),
      py::arg("trajectory"), py::arg("steps"),
      "The SGD engine's batches of one trajectory, (steps, batch) indices: for oracles and peers");
}

}  // namespace pysharp::module
