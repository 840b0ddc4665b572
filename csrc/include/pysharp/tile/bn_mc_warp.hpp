// GD+WD on BN matrix completion, one warp per trajectory: the tile for models too large
// for one thread's scratch (tile/bn_mc.hpp; the D 800 benchmark). Written once over a
// warp policy P (tile/warp.hpp): EmuWarp on the CPU (the tests), DeviceWarp in the kernel.
//
// The math is that of models/bn_matrix_completion.hpp and core/bn_cosine.hpp (the
// oracle), step by step as engine/trajectory.hpp runs GD+WD. The warp's scratch (shared
// memory on the device) holds the iterate w and gradient g (D each) and the N scores,
// later dL/ds, and a 0. Per step:
//   scores    lane l computes s_k for k = l, l + 32, ...: <U[rows_k], V[cols_k]>, summed
//             over the rank in order, as the model does;
//   BN loss   each sum over the observations (mean, ||s||^2, ||s - mean||^2, cos, the
//             error) is a lane's own strided partial sum, then a butterfly over the warp
//             (warp_sum): with ||w||^2 and ||g||^2 (summed the same way), the only sums
//             whose order differs from the model's and the engine's;
//   gradient  lane l owns coordinates i = l, l + 32, ... of w (row f = i / r of U or V,
//             column q = i % r) and sums dL/ds_k times the other factor's row over the
//             observations of row f in increasing k: the model's order, without atomics.
//             The terms come from a table built once on the host (bn_mc_warp_terms): for
//             each pass of 32 coordinates, each lane's observations padded to the longest
//             list of the pass with a term that adds +0 (dL/ds read from a slot that holds
//             0), so that the loop runs the same count in every lane, without masks.
// Consecutive lanes hold consecutive columns of a factor row, so the gradient's reads of
// the other factor's row fall in different shared-memory banks.
//
// A lane past the end (k >= N, i >= D) reads nothing of the scratch (load_if): other lanes
// may be writing the slot it would clamp to. Every lane of the warp agrees on the loss, the norms and whether the step is defined
// (butterfly sums give all lanes the same bits), so the warp branches as one. Nothing
// depends on where in a launch the trajectory runs: its bits are its own.
#pragma once

#if !defined(__CUDACC_RTC__)  // NVRTC has no standard library; the kernels need none of it
#include <climits>
#include <stdexcept>
#include <vector>
#endif

#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/tile/gd_wd_io.hpp"
#include "pysharp/tile/warp.hpp"

namespace pysharp::tile {

// The model and its gradient terms by pass: pass p (coordinates 32 p .. 32 p + 31) reads
// the terms pass_start[p] .. pass_start[p + 1], lane l the terms pass_start[p] + 32 j + l:
// the observation k whose dL/ds_k multiplies (k = N: the slot that holds 0) and where in w
// the other factor's row of that observation begins.
struct BNMcWarpData {
  BNMatrixCompletion<double> m;
  const int* pass_start;  // (ceil(D / 32) + 1,)
  const int* term_obs;    // (pass_start[last],)
  const int* term_other;  // (pass_start[last],)
};

// The observations of each factor row, on the host: those of factor row f (U's rows
// 0 .. m1 - 1, then V's as m1 .. m1 + m2 - 1) are obs[start[f] .. start[f + 1]) in
// increasing order, and other[j] is where in w the other factor's row of observation
// obs[j] begins. start has m1 + m2 + 1 entries, obs and other 2 N. A counting sort by
// factor row, stable, so each row's observations stay in increasing k.
inline void bn_mc_factor_lists(const BNMatrixCompletion<double>& m, int* start, int* obs,
                               int* other) {
  const int F = m.m1 + m.m2;
  for (int f = 0; f <= F; ++f) start[f] = 0;
  for (int k = 0; k < m.N; ++k) {
    ++start[m.rows[k] + 1];
    ++start[m.m1 + m.cols[k] + 1];
  }
  for (int f = 0; f < F; ++f) start[f + 1] += start[f];
  // start[f] is now where row f begins; it advances as the row fills, to where row f + 1
  // begins, and is shifted back after.
  for (int k = 0; k < m.N; ++k) {
    const int u_row = m.rows[k], v_row = m.m1 + m.cols[k];
    obs[start[u_row]] = k;
    other[start[u_row]++] = v_row * m.r;
    obs[start[v_row]] = k;
    other[start[v_row]++] = u_row * m.r;
  }
  for (int f = F; f >= 1; --f) start[f] = start[f - 1];
  start[0] = 0;
}

// Fills pass_start (ceil(D / 32) + 1 entries; nullptr: only count) from the factor lists'
// start and returns the number of terms, the length of term_obs and term_other.
inline long long bn_mc_warp_pass_starts(const BNMatrixCompletion<double>& m, const int* start,
                                        int* pass_start) {
  const int D = m.dim();
  long long total = 0;
  for (int i0 = 0, p = 0; i0 < D; i0 += kWarpLanes, ++p) {
    int longest = 0;
    for (int i = i0; i < i0 + kWarpLanes && i < D; ++i) {
      const int f = i / m.r, len = start[f + 1] - start[f];
      longest = len > longest ? len : longest;
    }
    if (pass_start) pass_start[p] = static_cast<int>(total);
    total += static_cast<long long>(kWarpLanes) * longest;
  }
  if (pass_start) pass_start[(D + kWarpLanes - 1) / kWarpLanes] = static_cast<int>(total);
  return total;
}

// Fills term_obs and term_other from the factor lists and pass_start.
inline void bn_mc_warp_fill_terms(const BNMatrixCompletion<double>& m, const int* start,
                                  const int* obs, const int* other, const int* pass_start,
                                  int* term_obs, int* term_other) {
  const int D = m.dim();
  for (int i0 = 0, p = 0; i0 < D; i0 += kWarpLanes, ++p) {
    const int longest = (pass_start[p + 1] - pass_start[p]) / kWarpLanes;
    for (int l = 0; l < kWarpLanes; ++l) {
      const int i = i0 + l, f = i < D ? i / m.r : 0;
      const int len = i < D ? start[f + 1] - start[f] : 0;
      for (int j = 0; j < longest; ++j) {
        const int at = pass_start[p] + j * kWarpLanes + l;
        term_obs[at] = j < len ? obs[start[f] + j] : m.N;  // z[N] holds 0: the term adds +0
        term_other[at] = j < len ? other[start[f] + j] : 0;
      }
    }
  }
}

#if !defined(__CUDACC_RTC__)
// The gradient terms of m by pass, built on the host (what BNMcWarpData points to).
struct BNMcWarpTerms {
  std::vector<int> pass_start, obs, other;

  explicit BNMcWarpTerms(const BNMatrixCompletion<double>& m)
      : pass_start(checked_passes(m)) {
    std::vector<int> start(m.m1 + m.m2 + 1), row_obs(2 * m.N), row_other(2 * m.N);
    bn_mc_factor_lists(m, start.data(), row_obs.data(), row_other.data());
    // The table's offsets are ints: count first.
    const long long total = bn_mc_warp_pass_starts(m, start.data(), nullptr);
    if (total > INT_MAX)
      throw std::length_error("the BN matrix completion warp tile's term table would exceed "
                              "2^31 entries");
    bn_mc_warp_pass_starts(m, start.data(), pass_start.data());
    obs.resize(total);
    other.resize(total);
    bn_mc_warp_fill_terms(m, start.data(), row_obs.data(), row_other.data(),
                          pass_start.data(), obs.data(), other.data());
  }

 private:
  static std::size_t checked_passes(const BNMatrixCompletion<double>& m) {
    const long long D = static_cast<long long>(m.m1 + 0LL + m.m2) * m.r;
    if (D > INT_MAX) throw std::length_error("(m1 + m2) r exceeds 2^31 coordinates");
    return static_cast<std::size_t>((D + kWarpLanes - 1) / kWarpLanes + 1);
  }
};
#endif

// The doubles of one warp's scratch: w and g (D each), the N scores and a 0 (the padding
// terms' dL/ds).
PYSHARP_TILE_HD long long bn_mc_warp_doubles(int D, int N) { return 2LL * D + N + 1; }

// Whether a model of D coordinates and N observations runs on the warp tile, given the
// shared memory one block may have (bytes): one warp's scratch must fit.
PYSHARP_TILE_HD bool bn_mc_warp_tile_fits(int D, int N, long long block_smem_bytes) {
  return D >= 1 && N >= 2 &&
         bn_mc_warp_doubles(D, N) * static_cast<long long>(sizeof(double)) <= block_smem_bytes;
}

template <class P>
struct BNMcWarpTile {
  template <class T>
  using reg = typename P::template reg<T>;
  using R = reg<double>;
  using I = reg<int>;
  using M = reg<bool>;

  BNMcWarpData data;

  // The loss (every lane the same) and gradient g at w; z holds the N scores on the way
  // and dL/ds after. Returns whether BatchNorm is defined at w (every lane the same).
  PYSHARP_TILE_HD bool loss_grad(const double* w, double* g, double* z, R& loss) const {
    const BNMatrixCompletion<double>& m = data.m;
    const int N = m.N, r = m.r, D = m.dim();
    const I lane = P::lane();
    R sum = 0.0, sq = 0.0;
    for (int k0 = 0; k0 < N; k0 += kWarpLanes) {
      const M in = lane + k0 < I(N);
      const I k = where(in, lane + k0, I(0));  // in bounds, whatever the lane
      const I a = P::load(m.rows, k) * r, b = (P::load(m.cols, k) + m.m1) * r;
      R s = 0.0;
      for (int q = 0; q < r; ++q) s += P::load(w, a + q) * P::load(w, b + q);
      P::store(z, k, s, in);  // read back below by this lane only
      s = where(in, s, R(0.0));
      sum += s;
      sq += s * s;
    }
    const R mean = warp_sum<P>(sum) * (1.0 / N);
    const R z2 = warp_sum<P>(sq);
    R r2 = 0.0;
    for (int k0 = 0; k0 < N; k0 += kWarpLanes) {
      const M in = lane + k0 < I(N);
      const R c = where(in, P::load_if(z, lane + k0, in) - mean, R(0.0));
      r2 += c * c;
    }
    r2 = warp_sum<P>(r2);
    const double noise = 8.0 * N * 2.220446049250313e-16;
    const bool defined = !P::any(!((r2 > R(0.0)) & (r2 > noise * noise * z2)));
    const R inv_r = recip(root(r2));
    R cos = 0.0, err2 = 0.0;
    for (int k0 = 0; k0 < N; k0 += kWarpLanes) {
      const M in = lane + k0 < I(N);
      const I k = where(in, lane + k0, I(0));  // in bounds of u, whatever the lane
      const R zhat = (P::load_if(z, k, in) - mean) * inv_r, u = P::load(m.u, k);
      const R e = zhat - u;
      cos += where(in, zhat * u, R(0.0));
      err2 += where(in, e * e, R(0.0));
    }
    cos = warp_sum<P>(cos);
    loss = warp_sum<P>(err2) * (0.5 * m.scale);
    for (int k0 = 0; k0 < N; k0 += kWarpLanes) {
      const M in = lane + k0 < I(N);
      const I k = where(in, lane + k0, I(0));
      const R zhat = (P::load_if(z, k, in) - mean) * inv_r;
      P::store(z, k, (cos * zhat - P::load(m.u, k)) * inv_r * m.scale, in);
    }
    P::sync();  // the gradient reads every lane's dL/ds
    for (int i0 = 0, p = 0; i0 < D; i0 += kWarpLanes, ++p) {
      const M in = lane + i0 < I(D);
      const I i = where(in, lane + i0, I(0));
      const I q = i - (i / r) * r;
      R acc = 0.0;
      for (int j = data.pass_start[p]; j < data.pass_start[p + 1]; j += kWarpLanes) {
        const I at = lane + j;
        acc += P::load(z, P::load(data.term_obs, at)) *
               P::load(w, P::load(data.term_other, at) + q);
      }
      P::store(g, i, acc, in);  // read below by this lane only
    }
    return defined;
  }

  // Trajectory b of io's batch, start to finish, on the warp's scratch
  // (bn_mc_warp_doubles):
  // the steps, records and divergence of tile/gd_wd_thread.hpp.
  PYSHARP_TILE_HD void run(long long b, const GdWdTileIO& io, double* scratch) const {
    const int D = data.m.dim();
    double* w = scratch;
    double* g = w + D;
    double* z = g + D;
    const I lane = P::lane();
    P::sync();  // the warp's previous trajectory is done with the scratch
    if (P::leader()) z[data.m.N] = 0.0;
    for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
      const M in = lane + i0 < I(D);
      const I i = where(in, lane + i0, I(0));
      P::store(w, i, P::load(io.w0, P::widen(i) + D * b), in);
    }
    P::sync();
    const double lr = io.lr[b], decay = 1.0 - lr * io.wd[b];
    long long div_step = -1, r = 0, next_record = 0;
    R loss = 0.0;
    for (long long t = 0; t <= io.steps; ++t) {
      const bool defined = loss_grad(w, g, z, loss);
      R norm2 = 0.0, gnorm2 = 0.0;
      for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
        const M in = lane + i0 < I(D);
        const I i = where(in, lane + i0, I(0));
        const R wi = P::load_if(w, i, in), gi = P::load_if(g, i, in);
        norm2 += wi * wi;
        gnorm2 += gi * gi;
      }
      norm2 = warp_sum<P>(norm2);
      gnorm2 = warp_sum<P>(gnorm2);
      if (!(defined && !P::any(!(finite(loss) & finite(norm2) & finite(gnorm2))))) {
        div_step = t;
        break;
      }
      if (t == next_record) {
        R vg = 0.0;  // v1 . grad L(w), each lane over its coordinates, then the butterfly
        if (io.top_grad) {
          for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
            const M in = lane + i0 < I(D);
            const I i = where(in, lane + i0, I(0));
            vg += P::load_if(io.v1, P::widen(i) + D * b, in) * P::load_if(g, i, in);
          }
          vg = warp_sum<P>(vg);
        }
        if (P::leader()) {
          io.loss[r * io.batch + b] = P::first(loss);
          io.norm2[r * io.batch + b] = P::first(norm2);
          io.grad_norm[r * io.batch + b] = P::first(gnorm2);  // ||grad L(w)||^2 until below
          if (io.top_grad) io.top_grad[r * io.batch + b] = P::first(vg);  // times ||w||: finish
        }
        ++r;
        next_record += io.record_every;
      }
      if (t == io.steps) break;
      // The update is checked whole before it is stored: a step that overflows leaves the
      // last finite iterate. Each lane updates the coordinates it owns.
      R nonfinite = 0.0;  // NaN if any coordinate of the update is not finite
      for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
        const M in = lane + i0 < I(D);
        const I i = where(in, lane + i0, I(0));
        const R wn = decay * P::load_if(w, i, in) - lr * P::load_if(g, i, in);
        nonfinite += wn - wn;
      }
      if (P::any(!(warp_sum<P>(nonfinite) == R(0.0)))) {
        div_step = t + 1;
        break;
      }
      P::sync();  // every lane is done reading w for this step
      for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
        const M in = lane + i0 < I(D);
        const I i = where(in, lane + i0, I(0));
        P::store(w, i, decay * P::load_if(w, i, in) - lr * P::load_if(g, i, in), in);
      }
      P::sync();  // the next step reads every lane's coordinates
    }
    if (P::leader()) gd_wd_finish(io, b, r, lr, decay, div_step);
    for (int i0 = 0; i0 < D; i0 += kWarpLanes) {
      const M in = lane + i0 < I(D);
      const I i = where(in, lane + i0, I(0));
      P::store(io.w_final, P::widen(i) + D * b, P::load_if(w, i, in), in);
    }
  }
};

}  // namespace pysharp::tile
