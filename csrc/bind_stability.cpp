// Bindings for the SGD linear-stability part of pysharp._core: square-loss
// models, the SGD engine, linearised-SGD moment runs.
#include "cpu/sgd.hpp"
#include "holders.hpp"

namespace pysharp::module {
namespace {


// The SGD runner on any model run_sgd takes (square-loss models; BN linear
// regression, whose batches get ghost BN): checks, then one GIL-free call.
template <class Model, class Real>
py::dict sgd_call(const Model& model, const carray<Real>& W0, const carray<Real>& lr,
                  const carray<int>& batch, const carray<Real>& wd, long long steps,
                  long long record_every, bool replacement, std::uint64_t seed, long long offset,
                  double max_loss) {
  require(W0.ndim() == 2 && W0.shape(1) == model.dim(),
          "w0 must be (B, " + std::to_string(model.dim()) + ")");
  const std::int64_t T = W0.shape(0);
  const int n = model.n_samples(), bmin = sgd_min_batch(model);
  require(lr.size() == T && batch.size() == T && wd.size() == T,
          "lr, batch and wd must have one entry per trajectory");
  require(steps >= 0 && record_every >= 1, "steps >= 0 and record_every >= 1");
  for (std::int64_t t = 0; t < T; ++t)
    require(batch.data()[t] >= bmin && (replacement || batch.data()[t] <= n),
            bmin == 1 ? "batch sizes must be in [1, n] (>= 1 with replacement)"
                      : "batch sizes must be in [2, n] (>= 2 with replacement): ghost BN "
                        "needs two samples per batch");
  SGDConfig cfg;
  cfg.steps = steps;
  cfg.record_every = record_every;
  cfg.replacement = replacement;
  cfg.seed = seed;
  cfg.max_loss = max_loss;
  carray<Real> W({(py::ssize_t)T, (py::ssize_t)model.dim()});
  std::copy(W0.data(), W0.data() + W0.size(), W.mutable_data());
  carray<Real> loss({(py::ssize_t)n_records(steps, record_every), (py::ssize_t)T});
  flags diverged(T);
  py::array_t<long long> diverged_step(T);
  {
    py::gil_scoped_release nogil;
    cpu::sgd_batch(model, cfg, W.mutable_data(), lr.data(), batch.data(), wd.data(), T, offset,
                   loss.mutable_data(), diverged.mutable_data(), diverged_step.mutable_data());
  }
  py::dict r;
  r["w"] = W;
  r["loss"] = loss;
  r["diverged"] = diverged;
  r["diverged_step"] = diverged_step;
  return r;
}

template <class Core, class Real>
void add_square_loss(py::class_<Core>& cls) {
  cls.def(
      "jacobians",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t P = checked_batch(c, W, "W");
        const py::ssize_t n = c.model.n_samples(), D = c.model.dim(), d = c.model.input_dim();
        carray<Real> F({(py::ssize_t)P, n}), A({(py::ssize_t)P, n, D}), GX({(py::ssize_t)P, n, d});
        {
          py::gil_scoped_release nogil;
          cpu::jacobians(c.model, W.data(), P, F.mutable_data(), A.mutable_data(),
                         GX.mutable_data());
        }
        return py::make_tuple(F, A, GX);
      },
      py::arg("W"), "(P, D) -> (f (P, n), grad_W f (P, n, D), grad_x f (P, n, d))");
  cls.def(
      "sgd",
      [](const Core& c, const carray<Real>& W0, const carray<Real>& lr, const carray<int>& batch,
         const carray<Real>& wd, long long steps, long long record_every, bool replacement,
         std::uint64_t seed, long long offset, double max_loss) {
        return sgd_call(c.model, W0, lr, batch, wd, steps, record_every, replacement, seed,
                        offset, max_loss);
      },
      py::arg("w0"), py::arg("lr"), py::arg("batch"), py::arg("wd"), py::arg("steps"),
      py::arg("record_every"), py::arg("replacement"), py::arg("seed"), py::arg("offset"),
      py::arg("max_loss"));
}

template <class Real>
void bind_stability_dtype(py::module_& m, const std::string& suffix) {
  py::class_<LinearRegressionCore<Real>> lr(m, ("LinearRegression" + suffix).c_str());
  lr.def(py::init<const carray<Real>&, const carray<Real>&, bool>(), py::arg("X"), py::arg("y"),
         py::arg("bias"));
  module::bind_kernels<module::CpuExec, LinearRegressionCore<Real>, Real>(lr);
  add_square_loss<LinearRegressionCore<Real>, Real>(lr);

  py::class_<TwoLayerNetCore<Real>> net(m, ("TwoLayerNet" + suffix).c_str());
  net.def(py::init<const carray<Real>&, const carray<Real>&, int, int>(), py::arg("X"),
          py::arg("y"), py::arg("width"), py::arg("activation"));
  module::bind_kernels<module::CpuExec, TwoLayerNetCore<Real>, Real>(net);
  add_square_loss<TwoLayerNetCore<Real>, Real>(net);

  m.def(
      "bn_linreg_jacobians",
      [](const BNLinRegCore<Real>& c, const carray<Real>& W) {
        const std::int64_t P = checked_batch(c, W, "W");
        const py::ssize_t n = c.model.n, d = c.model.d;
        carray<Real> A({(py::ssize_t)P, n, d}), GX({(py::ssize_t)P, n, d});
        flags ok(P);
        {
          py::gil_scoped_release nogil;
          cpu::bn_jacobians(c.model, W.data(), P, A.mutable_data(), GX.mutable_data(),
                            ok.mutable_data());
        }
        return py::make_tuple(A, GX, ok);
      },
      py::arg("core"), py::arg("W"), "(P, d) -> (grad_w p (P, n, d), grad_x p (P, n, d), ok (P,))");
  m.def(
      "bn_linreg_sgd",
      [](const BNLinRegCore<Real>& c, const carray<Real>& W0, const carray<Real>& lr,
         const carray<int>& batch, const carray<Real>& wd, long long steps,
         long long record_every, bool replacement, std::uint64_t seed, long long offset,
         double max_loss) {
        return sgd_call(c.model, W0, lr, batch, wd, steps, record_every, replacement, seed,
                        offset, max_loss);
      },
      py::arg("core"), py::arg("w0"), py::arg("lr"), py::arg("batch"), py::arg("wd"),
      py::arg("steps"), py::arg("record_every"), py::arg("replacement"), py::arg("seed"),
      py::arg("offset"), py::arg("max_loss"),
      "Mini-batch SGD+WD with ghost BN (each batch's own statistics) on BN linear regression");
  m.def(
      "bn_linreg_batch_loss_grad",
      [](const BNLinRegCore<Real>& c, const carray<Real>& W, const carray<int>& idx) {
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
