// CPU drivers for square-loss models: per-sample Jacobians, SGD trajectories
// and linearised-SGD moment runs, OpenMP over independent rows (results do
// not depend on the thread count: every row owns its RNG key and scratch).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/batched.hpp"
#include "pysharp/core/lanes.hpp"
#include "pysharp/engine/sgd.hpp"
#include "pysharp/models/square_loss.hpp"

namespace pysharp::cpu {

// F (P, n), A (P, n, D), GX (P, n, d) for the P rows of W (P, D).
template <class Model, class Real>
void jacobians(const Model& m, const Real* W, std::int64_t P, Real* F, Real* A, Real* GX) {
  const std::int64_t D = m.dim(), n = m.n_samples(), d = m.input_dim();
  const std::int64_t total = P * n, grain = dynamic_grain(total);
#pragma omp parallel if (total * D >= 20000)
  {
    std::vector<Real> work(m.work_size() + 1);
#pragma omp for schedule(dynamic, grain)
    for (std::int64_t t = 0; t < total; ++t) {
      const std::int64_t p = t / n, i = t % n;
      m.jacobian(W + p * D, m.X + i * d, F + t, A + t * D, GX + t * d, work.data());
    }
  }
}

// BN linear regression: A (P, n, d), GX (P, n, d); ok[p] = 0 where Xc w = 0.
template <class Model, class Real>
void bn_jacobians(const Model& m, const Real* W, std::int64_t P, Real* A, Real* GX,
                  std::uint8_t* ok) {
  const std::int64_t n = m.n, d = m.d, grain = dynamic_grain(P);
#pragma omp parallel if (P > 1 && P * n * d >= 20000)
  {
    std::vector<Real> work(n + d);
#pragma omp for schedule(dynamic, grain)
    for (std::int64_t p = 0; p < P; ++p)
      ok[p] = bn_linreg_jacobian(m, W + p * d, A + p * n * d, GX + p * n * d, work.data());
  }
}

// T SGD trajectories (square-loss models, or BN linear regression with ghost
// BN); trajectory t has global index offset + t (its RNG key), lr[t],
// batch[t], wd[t]. W (T, D) holds the starts and receives the finals; loss
// (records, T). Lane blocks of kNativeLanes trajectories (run_sgd_lanes) take
// the trajectories in order of batch size, a new block wherever the size
// changes (the last block of each size padded). A trajectory's bits depend on
// neither its block nor its lane: not on T, its position, the chunking or the
// thread count.
template <class Model, class Real>
void sgd_batch(const Model& m, const SGDConfig& c, Real* W, const Real* lr, const int* batch,
               const Real* wd, std::int64_t T, std::int64_t offset, Real* loss,
               std::uint8_t* diverged, long long* diverged_step) {
  constexpr int L = kNativeLanes<Real>;
  using V = Lanes<Real, L>;
  const std::int64_t D = m.dim();
  std::vector<std::int64_t> order(T);
  for (std::int64_t t = 0; t < T; ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(),
                   [batch](std::int64_t a, std::int64_t b) { return batch[a] < batch[b]; });
  std::vector<std::int64_t> start;  // first position in `order` of each block
  for (std::int64_t p = 0; p < T; ++p)
    if (start.empty() || p - start.back() == L || batch[order[p]] != batch[order[p - 1]])
      start.push_back(p);
  const std::int64_t blocks = static_cast<std::int64_t>(start.size());
  start.push_back(T);
  int max_batch = 1;
  for (std::int64_t t = 0; t < T; ++t) max_batch = std::max(max_batch, batch[t]);
#pragma omp parallel if (blocks > 1)
  {
    std::vector<V> w(D), scratch(sgd_lanes_scratch(m, max_batch));
    std::vector<int> iscratch(sgd_lanes_iscratch(m, L, max_batch));
    // Dynamic: diverging blocks finish early; the schedule never changes bits.
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t blk = 0; blk < blocks; ++blk) {
      const int lanes = static_cast<int>(start[blk + 1] - start[blk]);
      std::int64_t rows[L];
      std::uint64_t traj[L];
      Real lr_l[L], wd_l[L];
      Real* loss_l[L];
      long long step[L];
      for (int l = 0; l < L; ++l) {
        rows[l] = order[start[blk] + (l < lanes ? l : 0)];  // padding repeats lane 0
        traj[l] = static_cast<std::uint64_t>(offset + rows[l]);
        lr_l[l] = lr[rows[l]];
        wd_l[l] = wd[rows[l]];
        loss_l[l] = loss + rows[l];
      }
      gather_rows(W, D, rows, lanes, w.data());
      run_sgd_lanes(m, c, lanes, traj, w.data(), lr_l, batch[rows[0]], wd_l, loss_l, T, step,
                    scratch.data(), iscratch.data());
      scatter_rows(w.data(), D, rows, lanes, W);
      for (int l = 0; l < lanes; ++l) {
        diverged[rows[l]] = step[l] >= 0;
        diverged_step[rows[l]] = step[l];
      }
    }
  }
}

// R runs of linearised SGD on A (n, D), steps t0 .. t0 + steps - 1; run r
// uses RNG stream offset + r. X (R, D) states in and out, logg (R,) log growth.
template <class Real>
void linear_sgd_batch(const Real* A, int n, int D, Real lr, int B, bool replacement,
                      std::uint64_t seed, std::int64_t R, std::int64_t offset, long long t0,
                      long long steps, Real* X, Real* logg) {
  const std::int64_t grain = dynamic_grain(R);
#pragma omp parallel if (R > 1 && R * steps * B * static_cast<long long>(D) >= 20000)
  {
    std::vector<Real> scratch(static_cast<std::size_t>(D));
    std::vector<int> iscratch(static_cast<std::size_t>(n) + static_cast<std::size_t>(B));
#pragma omp for schedule(dynamic, grain)
    for (std::int64_t r = 0; r < R; ++r)
      logg[r] = run_linear_sgd(A, n, D, lr, B, replacement, seed,
                               static_cast<std::uint64_t>(offset + r), t0, steps, X + r * D,
                               scratch.data(), iscratch.data());
  }
}

}  // namespace pysharp::cpu
