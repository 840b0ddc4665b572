// What the CPU module (pysharp._core) and a run-time compiled square-loss model
// (pysharp.models.load_model) bind for the SGD linear-stability tools: the
// per-sample Jacobians and the SGD runner (models/square_loss.hpp's contract).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "bind_model.hpp"
#include "cpu/threads.hpp"
#include "pysharp/engine/sgd.hpp"

namespace pysharp::module {

// The SGD runner on any model run_sgd takes (square-loss models; BN linear
// regression, whose batches get ghost BN): checks, then one GIL-free call of Exec::sgd.
template <class Exec, class Core, class Real>
py::dict sgd_call(const Core& c, const carray<Real>& W0, const carray<Real>& lr,
                  const carray<int>& batch, const carray<Real>& wd, long long steps,
                  long long record_every, bool replacement, std::uint64_t seed, long long offset,
                  double max_loss) {
  const auto& model = c.model;
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
    const pysharp::cpu::CoreShare cores;
    Exec::sgd(c, cfg, W.mutable_data(), lr.data(), batch.data(), wd.data(), T, offset,
              loss.mutable_data(), diverged.mutable_data(), diverged_step.mutable_data());
  }
  py::dict r;
  r["w"] = W;
  r["loss"] = loss;
  r["diverged"] = diverged;
  r["diverged_step"] = diverged_step;
  return r;
}

template <class Exec, class Core, class Real>
void add_square_loss(py::class_<Core>& cls) {
  cls.def(
      "jacobians",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t P = checked_batch(c, W, "W");
        const py::ssize_t n = c.model.n_samples(), D = c.model.dim(), d = c.model.input_dim();
        carray<Real> F({(py::ssize_t)P, n}), A({(py::ssize_t)P, n, D}), GX({(py::ssize_t)P, n, d});
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::jacobians(c, W.data(), P, F.mutable_data(), A.mutable_data(),
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
        return sgd_call<Exec>(c, W0, lr, batch, wd, steps, record_every, replacement, seed,
                        offset, max_loss);
      },
      py::arg("w0"), py::arg("lr"), py::arg("batch"), py::arg("wd"), py::arg("steps"),
      py::arg("record_every"), py::arg("replacement"), py::arg("seed"), py::arg("offset"),
      py::arg("max_loss"));
}

}  // namespace pysharp::module
