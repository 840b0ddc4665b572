// Bindings for Hessian spectra (issue 14): stochastic Lanczos quadrature,
// batched over points x probes. Included by bindings.cpp after its shared
// helpers and model cores (bindings_stability.hpp included), and registered by
// one call, bind_spectra(m), at the end of the module body.
#pragma once

#include "pysharp/engine/slq.hpp"

namespace {

// SLQ for B points x P probes: the B * P (point, probe) problems fill the SIMD
// lanes of blocks (OpenMP over blocks); probe p is the same Rademacher vector
// at every point. Per problem (row-major (B, P, steps)): alpha, beta of the
// Lanczos tridiagonal, its Gauss nodes (ascending) and weights; count (B, P)
// the Lanczos steps taken (< steps after a breakdown: the quadrature is then
// exact, the remaining nodes repeat the largest one with weight 0).
// ok[b] = 0 where the model is undefined at point b.
template <class Model, class Real>
void slq_batch(const Model& m, const Real* W, std::int64_t B, int P, int steps,
               std::uint64_t seed, Real* alpha, Real* beta, Real* nodes, Real* weights,
               int* count, std::uint8_t* ok) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim(), N = B * P;
  std::fill(ok, ok + B, std::uint8_t(1));
  // Per-block buffers: a block's Lanczos run outweighs their allocation.
  auto no_scratch = [] { return 0; };
  cpu::for_each_block<L>(N, cpu::worth_threads(m, 3 * N * steps), no_scratch,
                         [&](const std::int64_t* pairs, int lanes, int&) {
    std::vector<V> w(D), Q(slq_basis_size(static_cast<int>(D), steps)), a(steps), b(steps);
    std::vector<Jet<V, 1>> jets(jet_scratch_size(m));
    std::vector<Real> d(steps), e(steps), wt(steps);
    std::int64_t rows[L];
    for (int l = 0; l < L; ++l) rows[l] = pairs[l] / P;
    cpu::gather_rows(W, D, rows, lanes, w.data());
    for (std::int64_t i = 0; i < D; ++i)
      for (int l = 0; l < L; ++l)
        set_lane(Q[i], l,
                 static_cast<Real>(rademacher(seed, kSlqStream,
                                              static_cast<std::uint64_t>(pairs[l] % P),
                                              static_cast<std::uint64_t>(i))));
    int cnt[L];
    const mask_t<V> defined = slq_lanczos(m, w.data(), steps, Q.data(), jets.data(), a.data(),
                                          b.data(), cnt);
    for (int l = 0; l < lanes; ++l) {
      const std::int64_t off = pairs[l] * steps;
      const int k = cnt[l];
      for (int j = 0; j < steps; ++j) {
        alpha[off + j] = lane(a[j], l);
        beta[off + j] = lane(b[j], l);
      }
      for (int j = 0; j < k; ++j) {
        d[j] = lane(a[j], l);
        e[j] = lane(b[j], l);
      }
      bool good = lane(defined, l) && gauss_quadrature(k, d.data(), e.data(), wt.data());
      for (int j = 0; j < steps; ++j) {
        nodes[off + j] = d[j < k ? j : k - 1];
        weights[off + j] = j < k ? wt[j] : Real(0);
      }
      count[pairs[l]] = k;
      if (!good) ok[rows[l]] = 0;  // every writer of row b stores 0: benign
    }
  });
}

template <class Core>
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
          slq_batch(c.model, W.data(), B, n_probes, steps, seed, alpha.mutable_data(),
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

void bind_spectra(py::module_& m) {
  def_slq<BNLinRegCore<double>>(m);
  def_slq<BNMatrixCompletionCore<double>>(m);
  def_slq<BNTwoLayerNetCore<double>>(m);
  def_slq<Toy3DCore<double>>(m);
  def_slq<LinearRegressionCore<double>>(m);
  def_slq<TwoLayerNetCore<double>>(m);
}

}  // namespace
