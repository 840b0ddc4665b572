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
namespace detail {
// a * b + c, with the multiply-add fused wherever the target has FMA. A rotation's
// sn * z + cs * t leaves the compiler free to fuse either product (-ffp-contract=fast), and
// GCC fuses one in the vectorised loop over a matrix's rows and the other in its scalar
// remainder: a band of rows (first_row, rows) then missed the bits of the full run on every
// FMA target (x86-64-v3, v4, -march=native), found by the portable build's AVX-512 core.
// Spelled out for scalars, the same product fuses in every row. Lane blocks are vectors
// already, one code path for every row.
template <class V>
PYSHARP_HD V mul_add(const V& a, const V& b, const V& c) {
  return a * b + c;
}
#if defined(__CUDA_ARCH__) || defined(__FMA__) || defined(__ARM_FEATURE_FMA)
PYSHARP_HD inline double mul_add(double a, double b, double c) { return fma(a, b, c); }
PYSHARP_HD inline float mul_add(float a, float b, float c) { return fmaf(a, b, c); }
#endif
}  // namespace detail

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
          Z[k * m + i + 1] = select(act, detail::mul_add(sn_i, z, cs_i * t), t);
          Z[k * m + i] = select(act, detail::mul_add(cs_i, z, -(sn_i * t)), z);
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

namespace detail {
template <class V>
PYSHARP_HD V lane_max(const V& x, const V& y) {
  return select(x < y, y, x);
}
template <class V>
PYSHARP_HD V lane_min(const V& x, const V& y) {
  return select(y < x, y, x);
}

// p'/p and -(p'/p)' at x for p(x) = det(sg T - x I), T of order m given by
// its diagonal a times s and squared couplings b2 (already times s^2), from the
// pivots of sg T - x I = L D L^T: u_0 = sg a_0 s - x, u_k = sg a_k s - x -
// b2_{k-1} / u_{k-1}. p is their product, so p'/p = sum u_k'/u_k, and the
// derivatives follow the same recurrence.
template <class V>
PYSHARP_HD void log_derivatives(int m, const V* a, const V& s, const V* b2,
                                lane_real_t<V> sg, const V& x, V& G, V& H) {
  using Real = lane_real_t<V>;
  V u = sg * a[0] * s - x;
  V inv = Real(1) / u;
  V t = -inv;         // u'/u (u' = -1)
  V dd = V(Real(0));  // u''
  G = t;
  H = t * t;
  for (int k = 1; k < m; ++k) {
    const V c = b2[k - 1] * inv;  // b^2 / u_{k-1}
    const V du = c * t - Real(1);
    dd = c * (dd * inv - Real(2) * t * t);
    u = (sg * a[k] * s - x) - c;
    inv = Real(1) / u;
    t = du * inv;
    G += t;
    H += t * t - dd * inv;
  }
}

// Laguerre's iteration for the largest root of p (as in log_derivatives), from
// x above it: for a polynomial with real roots it decreases monotonically to
// that root, cubically near it; the sign of the root in the step follows G, so
// an iterate that rounding puts just below the root steps back up to it. Lanes
// in `run` iterate, each until its step falls below the rounding of the scaled
// matrix (norm < 1); returns the lanes that had not, after 64 iterations.
template <class V>
PYSHARP_HD mask_t<V> laguerre_top(int m, const V* a, const V& s, const V* b2,
                                  lane_real_t<V> sg, V& x, mask_t<V> run) {
  using Real = lane_real_t<V>;
  const Real eps = machine_eps<Real>();
  for (int it = 0; it < 64 && any(run); ++it) {
    V G, H;
    log_derivatives(m, a, s, b2, sg, x, G, H);
    V disc = Real(m - 1) * (Real(m) * H - G * G);  // >= 0 in exact arithmetic
    disc = select(disc > V(Real(0)), disc, V(Real(0)));
    const V root = sqrt_(disc);
    const V step = Real(m) / (G + select(G < V(Real(0)), -root, root));
    const mask_t<V> good = run & is_finite(step);  // else x is the root
    x = select(good, x - step, x);
    run = good & (fabs(step) > Real(2) * eps * (fabs(x) + Real(1)));
  }
  return run;
}

// Per lane: whether sg T - y I (as in log_derivatives) is negative definite,
// that is, every eigenvalue of sg T lies below y (all pivots negative).
template <class V>
PYSHARP_HD mask_t<V> all_below(int m, const V* a, const V& s, const V* b2,
                               lane_real_t<V> sg, const V& y) {
  using Real = lane_real_t<V>;
  V u = sg * a[0] * s - y;
  mask_t<V> neg = u < V(Real(0));
  for (int k = 1; k < m; ++k) {
    u = (sg * a[k] * s - y) - b2[k - 1] / u;
    neg = neg & (u < V(Real(0)));
  }
  return neg;
}

// Whether x is, to `margin`, the largest eigenvalue of sg T: none above
// x + margin, one at least above x - margin. Sturm counts are exact for a
// matrix within a few ulps of T, so this certifies Laguerre's root whatever
// path its iterates took.
template <class V>
PYSHARP_HD mask_t<V> is_top(int m, const V* a, const V& s, const V* b2, lane_real_t<V> sg,
                            const V& x, lane_real_t<V> margin) {
  return all_below(m, a, s, b2, sg, x + margin) & !all_below(m, a, s, b2, sg, x - margin);
}
}  // namespace detail

// What the Lanczos convergence test for the top eigenpair needs of a symmetric
// tridiagonal T of order m >= 1 (diagonal a, b[i] couples i and i + 1): its
// largest eigenvalue theta, the magnitude z of the last component of theta's
// unit eigenvector, and ||T||_2 = max |eigenvalue|. O(m) per iteration, where
// the decomposition of tridiagonal_eigh costs O(m^2) rotations, each a chain
// of a square root and a division.
//
// T is rescaled by a power of two (exact) to a Gershgorin bound of order one.
// Laguerre's iteration on det(T - x I) (detail::laguerre_top) runs from above
// the Gershgorin bound down to theta. A Sturm count at -|theta| (a negative
// pivot: an eigenvalue below) says whether ||T|| needs the smallest
// eigenvalue too, found the same way on -T. Sturm counts certify both roots.
// A twisted factorisation at theta (pivots from both ends, meeting where the
// eigenvector is largest) gives the eigenvector's entries as products of
// accurate ratios, so z is accurate even where it is far below rounding.
//
// Returns false (per lane) where it does not vouch for its result: a zero or
// non-finite coupling (T splits, and theta's eigenvector may miss the last
// row), non-finite values, no convergence; the caller then falls back on
// tridiagonal_eigh. Each lane iterates on its own (masked), so its result does
// not depend on the other lanes. work: 2 m values.
template <class V>
PYSHARP_HD mask_t<V> tridiagonal_top_test(int m, const V* a, const V* b, V* theta, V* z,
                                          V* norm, V* work) {
  using Real = lane_real_t<V>;
  using M = mask_t<V>;
  constexpr int W = lane_width<V>;
  V* b2 = work;
  V* inv = work + m;
  M ok = true;
  V hi = a[0], lo = a[0];
  for (int i = 0; i < m; ++i) {
    V r = V(Real(0));
    if (i > 0) r = fabs(b[i - 1]);
    if (i + 1 < m) {
      r = r + fabs(b[i]);
      ok = ok & (fabs(b[i]) > V(Real(0)));
    }
    hi = detail::lane_max(hi, a[i] + r);
    lo = detail::lane_min(lo, a[i] - r);
  }
  const V big = detail::lane_max(fabs(hi), fabs(lo));
  ok = ok & is_finite(big);
  V s = V(Real(1));
  for (int l = 0; l < W; ++l) set_lane(s, l, inverse_binade(lane(big, l)));
  for (int k = 0; k + 1 < m; ++k) b2[k] = (b[k] * s) * (b[k] * s);
  const V margin = (hi * s - lo * s) * Real(1.0 / 256);  // strictly above the spectrum

  // Certificates of the Laguerre roots, in units of the scaled ||T|| < 1: a
  // root that fails one goes to tridiagonal_eigh. At a top cluster far tighter
  // than rounding Laguerre converges only linearly and stops up to ~40 eps
  // short; the window refuses that rather than return it.
  const Real window = Real(8) * machine_eps<Real>();
  V top = hi * s + margin;
  M failed = detail::laguerre_top(m, a, s, b2, Real(1), top, ok);
  failed = failed | !detail::is_top(m, a, s, b2, Real(1), top, window);

  // An eigenvalue below -|theta|? Then ||T|| = -(smallest eigenvalue).
  const M below = ok & !detail::all_below(m, a, s, b2, Real(-1), fabs(top));
  V bottom = -lo * s + margin;  // the top of -T
  if (any(below)) {
    failed = failed | detail::laguerre_top(m, a, s, b2, Real(-1), bottom, below);
    failed = failed | (below & !detail::is_top(m, a, s, b2, Real(-1), bottom, window));
  }
  const V scaled_norm = select(below, detail::lane_max(fabs(top), bottom), fabs(top));

  // theta's eigenvector x from the twisted factorisation at theta: the pivots
  // from the top (u) and from the bottom (v) meet at the index r where
  // gamma_r = u_r + v_r - (a_r - theta) is smallest; x_r = 1, x_k = -(b_k / u_k)
  // x_{k+1} above r, x_k = -(b_{k-1} / v_k) x_{k-1} below. Starting where x is
  // largest keeps every ratio used accurate: a pivot that theta's rounding
  // leaves without a correct digit (a Ritz value converged at a nearly
  // decoupled index) is never divided by. In place: inv[k] takes u_k, then
  // (x_k / x_{k+1})^2; b2[k] takes (x_{k+1} / x_k)^2.
  V* piv = inv;
  V u = a[0] * s - top;
  piv[0] = u;
  for (int k = 0; k + 1 < m; ++k) {
    u = (a[k + 1] * s - top) - b2[k] / u;
    piv[k + 1] = u;
  }
  V v = a[m - 1] * s - top;
  V best = fabs(piv[m - 1]), r = V(Real(m - 1));
  for (int k = m - 2; k >= 0; --k) {
    const V diag = a[k] * s - top;
    const V up = b2[k] / (piv[k] * piv[k]);
    const V down = b2[k] / (v * v);
    v = diag - b2[k] / v;
    const V gamma = fabs(piv[k] + v - diag);
    piv[k] = up;
    b2[k] = down;
    const M better = gamma < best;
    best = select(better, gamma, best);
    r = select(better, V(Real(k)), r);
  }
  V sum = V(Real(1)), xk2 = V(Real(1));  // ||x||^2 and x_k^2
  for (int k = m - 2; k >= 0; --k) {
    const M on = V(Real(k)) < r;
    xk2 = select(on, xk2 * piv[k], xk2);
    sum += select(on, xk2, V(Real(0)));
  }
  xk2 = V(Real(1));
  for (int k = 1; k < m; ++k) {
    const M on = r < V(Real(k));
    xk2 = select(on, xk2 * b2[k - 1], xk2);
    sum += select(on, xk2, V(Real(0)));
  }
  *z = sqrt_(xk2 / sum);  // xk2 = x_{m-1}^2
  *theta = top / s;
  *norm = scaled_norm / s;
  ok = ok & !failed & (*z == *z) & is_finite(*theta) & is_finite(*norm);
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
