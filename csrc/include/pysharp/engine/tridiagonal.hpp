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
        const V inv_r = Real(1) / r;  // one division, not two: the divider bounds a rotation
        const V sn_i = f * inv_r;
        const V cs_i = g * inv_r;
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

// The unit eigenvector s (m) of the symmetric tridiagonal matrix with diagonal
// a (m) and off-diagonal b (b[i] couples i and i+1, i < m - 1) for its
// eigenvalue theta (accurate to rounding, e.g. from tridiagonal_eigh): two
// steps of inverse iteration from a fixed generic vector, each an LU solve of
// T - theta I with partial pivoting (LAPACK's dgttrf / dgttrs), O(m) where
// the eigenvector matrix of tridiagonal_eigh costs O(m^3). A pivot that
// vanishes (theta exact, or T split into blocks by a zero coupling) is
// replaced by eps * ||T||: the solve then returns that direction, which is
// what inverse iteration wants. For a multiple theta the result is one unit
// vector of its eigenspace. work: 5 m reals. Sign unspecified.
template <class Real>
PYSHARP_HD void tridiagonal_eigenvector(int m, const Real* a, const Real* b, Real theta, Real* s,
                                        Real* work) {
  Real* dg = work;         // U's diagonal
  Real* du = dg + m;       // U's first superdiagonal
  Real* du2 = du + m;      // U's second superdiagonal (fill-in of interchanges)
  Real* dl = du2 + m;      // L's multipliers
  Real* swap = dl + m;     // 1 where rows i and i+1 were interchanged
  Real norm = Real(0);
  for (int i = 0; i < m; ++i) {
    const Real row = fabs(a[i] - theta) + (i > 0 ? fabs(b[i - 1]) : Real(0)) +
                     (i + 1 < m ? fabs(b[i]) : Real(0));
    norm = row > norm ? row : norm;
  }
  const Real floor = machine_eps<Real>() * (norm > Real(0) ? norm : Real(1));
  for (int i = 0; i < m; ++i) {
    dg[i] = a[i] - theta;
    du[i] = i + 1 < m ? b[i] : Real(0);
    dl[i] = i + 1 < m ? b[i] : Real(0);
    du2[i] = Real(0);
  }
  for (int i = 0; i + 1 < m; ++i) {
    if (fabs(dg[i]) >= fabs(dl[i])) {  // no interchange
      if (dg[i] == Real(0)) dg[i] = floor;
      const Real f = dl[i] / dg[i];
      dl[i] = f;
      dg[i + 1] -= f * du[i];
      swap[i] = Real(0);
    } else {  // interchange rows i and i + 1
      const Real f = dg[i] / dl[i];
      dg[i] = dl[i];
      dl[i] = f;
      const Real t = du[i];
      du[i] = dg[i + 1];
      dg[i + 1] = t - f * dg[i + 1];
      if (i + 2 < m) {
        du2[i] = du[i + 1];
        du[i + 1] = -f * du[i + 1];
      }
      swap[i] = Real(1);
    }
  }
  if (dg[m - 1] == Real(0)) dg[m - 1] = floor;
  // A start with no structure (the golden-ratio sequence): a start orthogonal to
  // the eigenvector stays so, and such starts are not rare for structured T (the
  // all-ones vector is orthogonal to eigenvectors of alternating sign).
  for (int i = 0; i < m; ++i) {
    const double t = 0.6180339887498949 * (i + 1);
    s[i] = Real(1 + (t - static_cast<long long>(t)));
  }
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i + 1 < m; ++i) {  // L
      if (swap[i] != Real(0)) {
        const Real t = s[i];
        s[i] = s[i + 1];
        s[i + 1] = t;
      }
      s[i + 1] -= dl[i] * s[i];
    }
    for (int i = m - 1; i >= 0; --i) {  // U
      Real r = s[i];
      if (i + 1 < m) r -= du[i] * s[i + 1];
      if (i + 2 < m) r -= du2[i] * s[i + 2];
      s[i] = r / dg[i];
    }
    Real big = Real(0);  // scale by the largest entry first: the solve may reach 1/eps^2
    for (int i = 0; i < m; ++i) big = fabs(s[i]) > big ? fabs(s[i]) : big;
    for (int i = 0; i < m; ++i) s[i] /= big;
    Real n2 = Real(0);
    for (int i = 0; i < m; ++i) n2 += s[i] * s[i];
    const Real inv = Real(1) / sqrt_(n2);
    for (int i = 0; i < m; ++i) s[i] *= inv;
  }
}

}  // namespace pysharp
