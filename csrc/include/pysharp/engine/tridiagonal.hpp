// Eigen-decomposition of a small symmetric tridiagonal matrix by the implicit
// QL algorithm with Wilkinson-type shifts (the tql2 / tqli scheme), for one
// matrix (V = Real) or for W matrices of the same order at once, one per lane
// of a lane block (V = Lanes, core/lanes.hpp).
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

// d (m): diagonal, overwritten with the eigenvalues (unsorted).
// e (m): e[i] couples i and i+1 for i < m-1; destroyed.
// Z (rows x m, row-major): overwritten with rows first_row .. first_row +
// rows - 1 of the eigenvector matrix, Z[r*m + c] is component first_row + r of
// eigenvector c (rows = -1: all m rows). Each row of that matrix evolves by
// the same rotations independently of the others, so a partial run gives the
// eigenvalues and those rows with exactly the bits of a full run, in O(m^2)
// instead of O(m^3): the last row is all a Lanczos convergence test needs, the
// first row all Gauss quadrature needs. Returns false (per lane) if an
// eigenvalue fails to converge in 60 iterations (does not happen for finite
// input in practice).
//
// Lanes: each lane runs its own QL iteration (its own split points, shifts,
// rotations and iteration counts) and waits, masked, while others still
// rotate, so its result does not depend on the other lanes. The W
// latency-bound chains of square roots and divisions run as one chain of
// vector instructions: that is what makes the lockstep Lanczos convergence
// tests cheap. A lane does the scalar instantiation's operations in the same
// order; its bits equal the scalar ones where the compiler fuses the same
// multiply-adds (with -ffp-contract=off; with FMA contraction the scalar and
// vector code fuse differently and agree to rounding).
template <class V>
PYSHARP_HD mask_t<V> tridiagonal_eigh(int m, V* d, V* e, V* Z, int first_row = 0,
                                      int rows = -1) {
  using Real = lane_real_t<V>;
  using M = mask_t<V>;
  constexpr int W = lane_width<V>;
  if (rows < 0) rows = m;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < m; ++c) Z[r * m + c] = V((first_row + r == c) ? Real(1) : Real(0));
  M ok = true;
  if (m == 0) return ok;
  e[m - 1] = V(Real(0));
  const Real eps = machine_eps<Real>();
  for (int l = 0; l < m; ++l) {
    int iter = 0;
    while (true) {
      // Per lane, the first index s >= l where the matrix splits.
      V split_at = V(Real(m - 1));
      M found = false;
      for (int s = l; s < m - 1 && any(!found); ++s) {
        const V dd = fabs(d[s]) + fabs(d[s + 1]);
        const M here = (!found) & (fabs(e[s]) <= eps * dd);
        split_at = select(here, V(Real(s)), split_at);
        found = found | here;
      }
      M live = ok & !(split_at == V(Real(l)));  // lanes still rotating for eigenvalue l
      if (!any(live)) break;
      if (++iter > 60) {
        ok = ok & !live;
        if (!any(ok)) return ok;
        break;
      }
      int s_of[W];
      int s_max = l;
      for (int w = 0; w < W; ++w) {
        s_of[w] = static_cast<int>(lane(split_at, w));
        if (lane(live, w) && s_of[w] > s_max) s_max = s_of[w];
      }
      V d_s;
      for (int w = 0; w < W; ++w) set_lane(d_s, w, lane(d[s_of[w]], w));
      V g = (d[l + 1] - d[l]) / (Real(2) * e[l]);
      V r = sqrt_(g * g + Real(1));
      g = d_s - d[l] + e[l] / (g + select(g >= V(Real(0)), r, -r));
      V sn = V(Real(1)), cs = V(Real(1)), p = V(Real(0));
      for (int i = s_max - 1; i >= l; --i) {
        M act = live & (V(Real(i)) < split_at);
        const V f = sn * e[i];
        const V b = cs * e[i];
        r = sqrt_(f * f + g * g);
        e[i + 1] = select(act, r, e[i + 1]);
        const M underflow = act & (r == V(Real(0)));
        if (any(underflow)) {  // deflate and restart this eigenvalue in those lanes
          d[i + 1] = select(underflow, d[i + 1] - p, d[i + 1]);
          for (int w = 0; w < W; ++w)
            if (lane(underflow, w)) set_lane(e[s_of[w]], w, Real(0));
          live = live & !underflow;
          act = act & !underflow;
          if (!any(live)) break;
        }
        const V sn_i = f / r;
        const V cs_i = g / r;
        const V g_i = d[i + 1] - p;
        const V r_i = (d[i] - g_i) * sn_i + Real(2) * cs_i * b;
        const V p_i = sn_i * r_i;
        d[i + 1] = select(act, g_i + p_i, d[i + 1]);
        g = select(act, cs_i * r_i - b, g);
        sn = select(act, sn_i, sn);
        cs = select(act, cs_i, cs);
        p = select(act, p_i, p);
        for (int k = 0; k < rows; ++k) {
          const V t = Z[k * m + i + 1];
          const V z = Z[k * m + i];
          Z[k * m + i + 1] = select(act, sn_i * z + cs_i * t, t);
          Z[k * m + i] = select(act, cs_i * z - sn_i * t, z);
        }
      }
      d[l] = select(live, d[l] - p, d[l]);
      e[l] = select(live, g, e[l]);
      for (int w = 0; w < W; ++w)
        if (lane(live, w)) set_lane(e[s_of[w]], w, Real(0));
    }
  }
  return ok;
}

}  // namespace pysharp
