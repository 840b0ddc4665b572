// What the CPU module (pysharp._core) and every run-time compiled model module
// (pysharp.models.load_model) bind for a model holder: the executor that runs
// bind_model.hpp's calls on the CPU, and SLQ. A holder is any type with a
// `model` member (and optionally `spectral`, bind_model.hpp).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "bind_model.hpp"
#include "cpu/batched.hpp"
#include "cpu/engine.hpp"
#include "cpu/sgd.hpp"
#include "cpu/slq.hpp"
#include "cpu/threads.hpp"

namespace pysharp::module {

// Runs the bindings' calls on the CPU: OpenMP over lane blocks (cpu/).
struct CpuExec {
  template <class Core, class Real>
  static void loss_grad(const Core& c, const Real* W, std::int64_t B, Real* loss, Real* G,
                        std::uint8_t* ok) {
    cpu::loss_grad(c.model, W, B, loss, G, ok);
  }
  template <int N, class Core, class Real>
  static void directional(const Core& c, const Real* W, const Real* V, std::int64_t B,
                          Real* out, std::uint8_t* ok) {
    cpu::directional<N>(c.model, W, V, B, out, ok);
  }
  template <class Core, class Real>
  static void hessian(const Core& c, const Real* W, std::int64_t B, Real* H, std::uint8_t* ok) {
    cpu::hessian(c.model, W, B, H, ok);
  }
  template <class Core, class Real>
  static void lanczos(const Core& c, const LanczosOptions& o, const Real* W, const Real* start,
                      const std::uint64_t* streams, std::int64_t B, Real* evals, Real* evecs,
                      Real* resid, int* iterations, std::uint8_t* converged, std::uint8_t* ok) {
    cpu::lanczos_batch(c.model, o, W, start, streams, B, evals, evecs, resid, iterations,
                       converged, ok);
  }
  template <class Core, class Real>
  static void run(const Core& c, const EngineConfig& cfg, bool reduced, const Real* W0,
                  const Hyperparameters<Real>& h, std::int64_t B, long long offset,
                  RunOutputs<Real>& out) {
    const BatchRecords<Real> rec = out.host_records();
    if constexpr (has_reduced<Core>::value) {
      if (reduced) {
        cpu::run_batch_spectral(c.model, c.spectral, cfg, W0, h, B, offset, rec);
        return;
      }
    }
    cpu::run_batch(c.model, cfg, W0, h, B, offset, rec);
  }
  template <class Core>
  static void slq(const Core& c, const double* W, std::int64_t B, int P, int steps,
                  std::uint64_t seed, double* alpha, double* beta, double* nodes,
                  double* weights, int* count, std::uint8_t* ok) {
    cpu::slq_batch(c.model, W, B, P, steps, seed, alpha, beta, nodes, weights, count, ok);
  }
  template <class Core, class Real>
  static void jacobians(const Core& c, const Real* W, std::int64_t P, Real* F, Real* A,
                        Real* GX) {
    cpu::jacobians(c.model, W, P, F, A, GX);
  }
  template <class Core, class Real>
  static void sgd(const Core& c, const SGDConfig& cfg, Real* W, const Real* lr, const int* batch,
                  const Real* wd, std::int64_t T, std::int64_t offset, Real* loss,
                  std::uint8_t* diverged, long long* diverged_step) {
    cpu::sgd_batch(c.model, cfg, W, lr, batch, wd, T, offset, loss, diverged, diverged_step);
  }
};

// slq(core, W, n_probes, steps, seed), a module-level function overloaded on the holder type.
template <class Exec, class Core>
void def_slq(py::module_& m) {
  m.def(
      "slq",
      [](const Core& c, const carray<double>& W, int n_probes, int steps, std::uint64_t seed) {
        const std::int64_t B = checked_batch(c, W, "W");
        const int D = c.model.dim();
        require(n_probes >= 1, "n_probes must be >= 1");
        require(steps >= 1 && steps <= D, "steps must be in [1, D]");
        const std::vector<py::ssize_t> shape{(py::ssize_t)B, (py::ssize_t)n_probes,
                                             (py::ssize_t)steps};
        carray<double> alpha(shape), beta(shape), nodes(shape), weights(shape);
        py::array_t<int> count({(py::ssize_t)B, (py::ssize_t)n_probes});
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::slq(c, W.data(), B, n_probes, steps, seed, alpha.mutable_data(),
                    beta.mutable_data(), nodes.mutable_data(), weights.mutable_data(),
                    count.mutable_data(), ok.mutable_data());
        }
        py::dict r;
        r["alpha"] = alpha;
        r["beta"] = beta;
        r["nodes"] = nodes;
        r["weights"] = weights;
        r["count"] = count;
        r["ok"] = ok;
        return r;
      },
      py::arg("model"), py::arg("W"), py::arg("n_probes"), py::arg("steps"), py::arg("seed"),
      "Stochastic Lanczos quadrature of H(w) (float64 model cores): (B, D) -> dict of alpha, "
      "beta, nodes, weights (B, P, steps), count (B, P), ok (B,)");
}

// The kernels, Lanczos and the trajectory engine of a holder, run on the CPU.
template <class Core, class Real>
void bind_cpu_model(py::class_<Core>& cls) {
  bind_model<CpuExec, Core, Real>(cls);
}

}  // namespace pysharp::module
