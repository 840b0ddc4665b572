// GD+WD on BN linear regression, eight trajectories per warp, float64, both products of
// a step on mma.m8n8k4 (tile/warp.hpp has the fragment layout). Written once over a
// warp policy P: EmuWarp on the CPU (the tests), DeviceWarp in the kernels.
//
// The math is that of models/bn_linear_regression.hpp and core/bn_cosine.hpp (the
// oracle), step by step as engine/trajectory.hpp runs GD+WD; only the order of the
// sums differs (so results agree to rounding, not to the bit):
//   z = Xc w,  zc = z - mean z,  zhat = zc / ||zc||,  cos = zhat . u,
//   L = (scale / 2) ||zhat - u||^2,  dL/dz = scale (cos zhat - u) / ||zc||,
//   grad = Xc^T dL/dz,  w+ = (1 - lr wd) w - lr grad.
// A tile of 8 trajectories (rows) does, per step,
//   Z (8 x n) = W (8 x d) Xc^T    and    G (8 x d) = R (8 x n) Xc,  R = dL/dz,
// as 8 x 8 x 4 products. The order in which a product sums over its inner index is
// free, so each inner block of 4 is chosen to be the indices a lane already holds:
// block (b, i) of the coordinates is {8 b + 2 q + i : q = 0..3}, and likewise for the
// samples. Then the accumulator of Z is the A operand of G (no shuffles), and G comes
// out in the layout W is kept in: lane (group g, quad q) holds, of trajectory g,
//   w[b][i] = W[g][8 b + 2 q + i]   (b < DP / 8, i = 0, 1)
//   z[b][i] = Z[g][8 b + 2 q + i]   (b < NP / 8, i = 0, 1).
// d and n are padded to multiples of 8 with zero rows and columns of Xc (and zero u):
// padded coordinates of W stay 0, padded samples are masked out of the sample sums.
// Per-trajectory sums are a lane's own partial sum (in register order) then a
// butterfly over its quad (quad_sum): the four lanes get identical bits.
//
// Divergence freezing, as the engine does it: a trajectory whose loss is undefined or
// whose loss, ||w||^2 or ||grad||^2 is not finite at step t is flagged at t; one whose
// update is not finite is flagged at t + 1. Either way it keeps its last finite iterate,
// records nothing more, and its lanes go on computing without effect on any other row.
#pragma once

#include <cstdint>

#include "pysharp/tile/gd_wd_io.hpp"
#include "pysharp/tile/warp.hpp"

namespace pysharp::tile {

PYSHARP_TILE_HD constexpr int round_up8(int x) { return (x + 7) / 8 * 8; }

// The data of one BN linear regression in tile layout: Xc padded to (NP, DP) row-major
// (zeros outside (n, d)), u padded to NP, and the model's scalars.
struct BNLinRegTileData {
  const double* xc;  // (NP, DP)
  const double* u;   // (NP,)
  double scale;      // 2 var(y)
  double floor_coef;  // (d eps)^2 ||Xc||_F^2: ||zc||^2 must exceed floor_coef ||w||^2
};

// Writes Xc (n, d) and u (n,) into the padded arrays xc_pad (NP * DP) and u_pad (NP).
inline void pack_bn_linreg(const double* Xc, const double* u, int n, int d, double* xc_pad,
                           double* u_pad) {
  const int NP = round_up8(n), DP = round_up8(d);
  for (int i = 0; i < NP; ++i) {
    u_pad[i] = i < n ? u[i] : 0.0;
    for (int j = 0; j < DP; ++j) xc_pad[i * DP + j] = i < n && j < d ? Xc[i * d + j] : 0.0;
  }
}

template <class P, int D, int N>
struct BNLinRegTile {
  static_assert(D >= 1 && N >= 2, "BN linear regression needs d >= 1 and n >= 2");
  static constexpr int DP = round_up8(D), NP = round_up8(N);
  static constexpr int DB = DP / 8, NB = NP / 8;  // 8-wide blocks of coordinates, samples
  template <class T>
  using reg = typename P::template reg<T>;
  using R = reg<double>;
  using M = reg<bool>;
  using I = reg<int>;

  // A lane holding w, Z and G at once needs 2 DB + 2 NB + 2 DB doubles. Above this
  // budget (d100 n200: 102 doubles, 204 of the 255 registers, and ptxas spilled) w is
  // parked in shared memory while G is formed, where it is not needed:
  // kParkDoubles per warp.
  static constexpr bool kParkW = 4 * DB + 2 * NB > 80;
  static constexpr int kParkDoubles = kParkW ? 2 * DB * kWarpLanes : 0;

  BNLinRegTileData data;

  // The loss and gradient of each row at w (every lane of a row gets the row's values).
  struct Eval {
    R loss, norm2, gnorm2;
    M ok;         // defined and finite, as the engine's observe() requires
    R g[DB][2];   // gradient, in w's layout
    R vg;         // v1 . grad L(w), where evaluate is given v1
  };

  // park: this warp's kParkDoubles of (shared) memory, unused if kParkW is false; w is
  // the same on return. dot: also e.vg = v1[row] . g, v1 (B, D), row the lane's trajectory
  // (taken here, while w is parked: with w, G and the reads of v1 live at once, d 100
  // n 200 spilled). A flag and v1 as given, not a pointer chosen per step, and the row
  // through P::here: a chosen pointer, or an index the compiler hoists out of the step
  // loop, stays in registers through Z's peak, and shapes near 255 registers spilled.
  PYSHARP_TILE_HD void evaluate(R (&w)[DB][2], Eval& e, volatile double* park,
                                bool dot = false, const double* v1 = nullptr,
                                const reg<long long>& row = reg<long long>(0)) const {
    const I l = P::lane();
    const I group = l >> 2, quad = l & 3;
    // Z = W Xc^T. B operand of block (coordinate block b, i) and sample block s:
    // B[k][c] = Xc[8 s + c][8 b + 2 k + i], lane (g, q) holds B[q][g].
    // The sum of z (core/bn_cosine.hpp's mean) is taken as each block of Z is complete,
    // over the real samples (padded ones have z = 0).
    R z[NB][2];
    R zsum = R(0.0);
    PYSHARP_UNROLL
    for (int s = 0; s < NB; ++s) {
      z[s][0] = R(0.0);
      z[s][1] = R(0.0);
      const I row = (8 * s + group) * DP + 2 * quad;
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i)
          P::mma(z[s][0], z[s][1], w[b][i], P::load(data.xc, row + (8 * b + i)));
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) zsum += z[s][i];
    }
    R w2 = R(0.0);
    PYSHARP_UNROLL
    for (int b = 0; b < DB; ++b)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) w2 += w[b][i] * w[b][i];
    w2 = quad_sum<P>(w2);
    if constexpr (kParkW) {
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i) P::park(park, 2 * b + i, w[b][i]);
    }

    // BatchNorm's cosine loss (core/bn_cosine.hpp), sums over the real samples only.
    // Lane (g, q) holds samples 8 s + 2 q + i; u and the validity of a sample are
    // re-read where needed rather than kept (registers go to z).
    const R mean = quad_sum<P>(zsum) * (1.0 / double(N));
    R r2 = R(0.0);
    PYSHARP_UNROLL
    for (int s = 0; s < NB; ++s)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) {
        z[s][i] = where(sample(s, i, quad) < I(N), z[s][i] - mean, R(0.0));
        r2 += z[s][i] * z[s][i];
      }
    r2 = quad_sum<P>(r2);
    // ||z||^2 of the noise floor as ||zc||^2 + n mean^2 (equal in exact arithmetic; the
    // floor is a relative tolerance of 8 n eps): summing z^2 itself kept Z live beside
    // its centred copy, and d100 n200 spilled.
    const R z2 = r2 + double(N) * (mean * mean);
    const double eps = 2.220446049250313e-16;
    const double noise = 8.0 * double(N) * eps;
    const M defined = (r2 > data.floor_coef * w2) & (r2 > (noise * noise) * z2);
    const R inv_r = recip(root(r2));
    R cos_zu = R(0.0), err2 = R(0.0);
    PYSHARP_UNROLL
    for (int s = 0; s < NB; ++s)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) {
        const R u = P::load(data.u, sample(s, i, quad));  // 0 on padded samples
        z[s][i] = z[s][i] * inv_r;                        // zhat (0 on padded samples)
        cos_zu += z[s][i] * u;
        const R d = z[s][i] - u;
        err2 += d * d;
      }
    cos_zu = quad_sum<P>(cos_zu);
    e.loss = quad_sum<P>(err2) * (0.5 * data.scale);
    PYSHARP_UNROLL
    for (int s = 0; s < NB; ++s)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i)
        z[s][i] = (cos_zu * z[s][i] - P::load(data.u, sample(s, i, quad))) * inv_r * data.scale;

    // G = R Xc. Inner block (sample block s, i): A[g][k] = R[g][8 s + 2 k + i] is z[s][i]
    // as it stands; B[k][c] = Xc[8 s + 2 k + i][8 b + c], lane (g, q) holds B[q][g].
    // Sample blocks outermost: z[s] is dead once used (each G element still sums its
    // inner blocks in the order (s, i)).
    PYSHARP_UNROLL
    for (int b = 0; b < DB; ++b) {
      e.g[b][0] = R(0.0);
      e.g[b][1] = R(0.0);
    }
    const I col = 2 * quad * DP + group;
    PYSHARP_UNROLL
    for (int s = 0; s < NB; ++s)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i)
        PYSHARP_UNROLL
        for (int b = 0; b < DB; ++b)
          P::mma(e.g[b][0], e.g[b][1], z[s][i], P::load(data.xc, col + (8 * s + i) * DP + 8 * b));
    if (dot) {
      // One 64-bit index, each coordinate a constant offset from it (an index selected per
      // coordinate, as for_each_coord gives, cost a register pair each and spilled).
      const reg<long long> at = P::here(row) * static_cast<long long>(D) + P::widen(2 * quad);
      R vg = R(0.0);
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i)
          vg += P::load_if(v1, at + reg<long long>(8 * b + i), 2 * quad + (8 * b + i) < I(D)) *
                e.g[b][i];
      e.vg = quad_sum<P>(vg);
    }
    if constexpr (kParkW) {
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i) w[b][i] = P::unpark(park, 2 * b + i);
    }
    R g2 = R(0.0);
    PYSHARP_UNROLL
    for (int b = 0; b < DB; ++b)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) g2 += e.g[b][i] * e.g[b][i];
    e.gnorm2 = quad_sum<P>(g2);
    e.norm2 = w2;
    e.ok = defined & finite(e.loss) & finite(e.gnorm2) & finite(e.norm2);
  }

  // Runs one tile, traj (per lane) naming the trajectory of the lane's row in io's
  // batch, or -1 for a padding row (park as for evaluate): every row from io.w0 to io.steps, as engine/trajectory.hpp's GD+WD
  // (records at steps 0, every, ... <= steps; divergence frozen and flagged).
  PYSHARP_TILE_HD void run(const reg<long long>& traj, const GdWdTileIO& io,
                           volatile double* park) const {
    const I l = P::lane();
    const I quad = l & 3;
    const M real = traj > reg<long long>(-1);
    const reg<long long> t0 = where(real, traj, reg<long long>(0));  // padding reads row 0
    const M writer = real & (quad == I(0));
    R w[DB][2];
    for_each_coord(quad, [&](int b, int i, const reg<long long>& at, const M& in) {
      w[b][i] = where(in & real, load_row(io.w0, t0 * static_cast<long long>(D) + at), R(0.0));
    });
    const R lr = load_row(io.lr, t0);
    const R decay = 1.0 - lr * load_row(io.wd, t0);
    M live = real;
    reg<long long> div_step = reg<long long>(-1);
    long long next_record = 0, r = 0;
    Eval e;
    for (long long t = 0; t <= io.steps; ++t) {
      evaluate(w, e, park, io.top_grad && t == next_record, io.v1, t0);
      const M bad = live & !e.ok;
      div_step = where(bad, reg<long long>(t), div_step);
      live = live & e.ok;
      if (t == next_record) {
        const reg<long long> at = reg<long long>(r * io.batch) + t0;
        P::store(io.loss, at, e.loss, writer & live);
        P::store(io.norm2, at, e.norm2, writer & live);
        P::store(io.grad_norm, at, e.gnorm2, writer & live);  // ||grad L(w)||^2 until below
        if (io.top_grad) P::store(io.top_grad, at, e.vg, writer & live);  // times ||w|| below
        next_record += io.record_every;
        ++r;
      }
      if (t == io.steps || !P::any(live)) break;
      R wn[DB][2];
      R nonfinite = R(0.0);  // NaN if any coordinate of the row's update is not finite
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i) {
          wn[b][i] = decay * w[b][i] - lr * e.g[b][i];
          nonfinite += wn[b][i] - wn[b][i];
        }
      const M fine = quad_sum<P>(nonfinite) == R(0.0);
      const M move = live & fine;
      PYSHARP_UNROLL
      for (int b = 0; b < DB; ++b)
        PYSHARP_UNROLL
        for (int i = 0; i < 2; ++i) w[b][i] = where(move, wn[b][i], w[b][i]);
      div_step = where(live & !fine, reg<long long>(t + 1), div_step);
      live = move;
    }
    // Records never reached (a frozen row) are NaN, as in the engine. The others get the
    // effective LR lr / ((1 - lr wd) ||w||^2) and ||grad L(theta)|| = ||w|| ||grad L(w)||
    // from what the step loop stored, here: a division and two roots kept out of the loop.
    const long long n_rec = io.steps / io.record_every + 1;
    const R nan = R(__builtin_nan(""));
    for (long long k = 0; k < n_rec; ++k) {
      const M missed = writer & (div_step > reg<long long>(-1)) &
                       (reg<long long>(k * io.record_every) >= div_step);
      const M kept = writer & !missed;
      const reg<long long> at = reg<long long>(k * io.batch) + t0;
      const R norm2 = P::load(io.norm2, at), gnorm2 = P::load(io.grad_norm, at);
      P::store(io.eff_lr, at, where(kept, lr / (decay * norm2), nan), writer);
      P::store(io.grad_norm, at, where(kept, root(norm2) * root(gnorm2), nan), writer);
      if (io.top_grad)
        P::store(io.top_grad, at, where(kept, root(norm2) * P::load(io.top_grad, at), nan),
                 writer);
      P::store(io.loss, at, nan, missed);
      P::store(io.norm2, at, nan, missed);
    }
    for_each_coord(quad, [&](int b, int i, const reg<long long>& at, const M& in) {
      P::store(io.w_final, t0 * static_cast<long long>(D) + at, w[b][i], in & real);
    });
    P::store(io.diverged, t0, where(div_step > reg<long long>(-1), reg<std::uint8_t>(1),
                                    reg<std::uint8_t>(0)),
             writer);
    P::store(io.diverged_step, t0, div_step, writer);
  }

 private:
  // The sample that lane quad q holds in z[s][i].
  PYSHARP_TILE_HD static I sample(int s, int i, const I& quad) { return 8 * s + i + 2 * quad; }
  // A lane-dependent read of a per-trajectory array.
  PYSHARP_TILE_HD static R load_row(const double* p, const reg<long long>& index) {
    return P::load(p, index);
  }
  // f(b, i, at, in) for each of the lane's coordinates, held in fragment slot [b][i]: its
  // index as long long (0 where out of range, so every access stays in bounds) and in,
  // whether it is < D.
  template <class F>
  PYSHARP_TILE_HD static void for_each_coord(const I& quad, F&& f) {
    PYSHARP_UNROLL
    for (int b = 0; b < DB; ++b)
      PYSHARP_UNROLL
      for (int i = 0; i < 2; ++i) {
        const I coord = 8 * b + 2 * quad + i;
        const M in = coord < I(D);
        f(b, i, where(in, P::widen(coord), reg<long long>(0)), in);
      }
  }
};

}  // namespace pysharp::tile
