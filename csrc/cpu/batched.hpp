// Batched CPU drivers: one model evaluation per row of a (B, D) array,
// OpenMP over rows. Each row is independent, so results do not depend on the
// thread count. ok[b] = 0 marks a row where the model is undefined.
#pragma once

#include <cstdint>
#include <vector>

#include "pysharp/models/derivatives.hpp"

namespace pysharp::cpu {

// Threads pay off only above some work: waking a team costs microseconds, and
// far more when the cores are busy. `rows` evaluations of a model.
template <class Model>
bool worth_threads(const Model& m, std::int64_t rows) {
  return rows > 1 && rows * static_cast<std::int64_t>(m.dim()) * (m.work_size() + 1) >= 20000;
}

template <class Model, class Real>
void loss_grad(const Model& m, const Real* W, std::int64_t B, Real* loss, Real* G,
               std::uint8_t* ok) {
  const std::int64_t D = m.dim();
#pragma omp parallel if (worth_threads(m, B))
  {
    std::vector<Real> work(m.work_size() + 1);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < B; ++b)
      ok[b] = m.loss_grad(W + b * D, loss + b, G + b * D, work.data());
  }
}

// Order 1: out = H v (HVP); order 2: out = D^3L[v, v].
template <int Order, class Model, class Real>
void directional(const Model& m, const Real* W, const Real* V, std::int64_t B,
                 Real* out, std::uint8_t* ok) {
  const std::int64_t D = m.dim();
#pragma omp parallel if (worth_threads(m, 3 * B))
  {
    std::vector<Jet<Real, Order>> scratch(jet_scratch_size(m));
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < B; ++b) {
      if constexpr (Order == 1)
        ok[b] = hvp(m, W + b * D, V + b * D, out + b * D, scratch.data());
      else
        ok[b] = third_contraction(m, W + b * D, V + b * D, out + b * D,
                                  scratch.data());
    }
  }
}

// Dense Hessians (B, D, D), column j = H e_j. For small D only: D HVPs a row.
template <class Model, class Real>
void hessian(const Model& m, const Real* W, std::int64_t B, Real* H, std::uint8_t* ok) {
  const std::int64_t D = m.dim();
  const std::int64_t total = B * D;
#pragma omp parallel if (worth_threads(m, 3 * total))
  {
    std::vector<Jet<Real, 1>> scratch(jet_scratch_size(m));
    std::vector<Real> e(D, Real(0)), col(D);
    // Flattened over (row, column) so that a single row still uses all threads.
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < total; ++t) {
      const std::int64_t b = t / D, j = t % D;
      e[j] = Real(1);
      const bool good = hvp(m, W + b * D, e.data(), col.data(), scratch.data());
      e[j] = Real(0);
      Real* Hb = H + b * D * D;
      for (std::int64_t i = 0; i < D; ++i) Hb[i * D + j] = col[i];
      if (j == 0) ok[b] = good;
    }
  }
}

}  // namespace pysharp::cpu
