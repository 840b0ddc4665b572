// Lanczos for the largest eigenpair (k = 1) of W symmetric operators at once,
// one per lane of a lane block (core/lanes.hpp): the operator is applied to a
// whole block of Krylov vectors (one HVP of jets of lanes serves W points) and
// the recurrence, the full reorthogonalisation, the convergence tests (every
// lane's top Ritz pair, tridiagonal_top_test in tridiagonal.hpp) and the Ritz
// vectors run in SIMD across lanes. Each lane keeps its own tridiagonal
// matrix, convergence test, restarts and stopping step, so its result never
// depends on the other lanes: it is the result of lanczos() (lanczos.hpp, k = 1) for that lane's
// operator, up to rounding (lane arithmetic, and a test that finds the top
// Ritz pair by Laguerre's iteration where lanczos() decomposes T_m by QL).
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/engine/lanczos.hpp"

namespace pysharp {

// Scratch of lanczos_lanes: V values and Reals.
PYSHARP_HD inline long long lanczos_lanes_scratch_v(int D, int m_max) {
  return (m_max + 2LL) * D + 6LL * m_max;
}
PYSHARP_HD inline long long lanczos_lanes_scratch_reals(int D, int m_max, int W) {
  return 7LL * m_max + W * (m_max + 1LL) + 2LL * D;
}

namespace detail {
// z -= sum_r (Q_r . z) Q_r over the n rows of Q, four rows at a time: their
// four products with the same z are independent chains of one pass over z
// (classical Gram-Schmidt within a group, modified between groups). One
// D-long chain per row, as in project_out, left the lockstep Lanczos waiting
// on the adder's latency for a third of its time.
template <class V>
void project_out_blocked(V* z, const V* Q, int n, int D) {
  using Real = lane_real_t<V>;
  int r = 0;
  for (; r + 4 <= n; r += 4) {
    const V* q0 = Q + static_cast<long long>(r) * D;
    const V *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
    V c0 = V(Real(0)), c1 = V(Real(0)), c2 = V(Real(0)), c3 = V(Real(0));
    for (int i = 0; i < D; ++i) {
      c0 += q0[i] * z[i];
      c1 += q1[i] * z[i];
      c2 += q2[i] * z[i];
      c3 += q3[i] * z[i];
    }
    for (int i = 0; i < D; ++i) z[i] = z[i] - c0 * q0[i] - c1 * q1[i] - c2 * q2[i] - c3 * q3[i];
  }
  project_out(z, Q + static_cast<long long>(r) * D, n - r, D);
}
}  // namespace detail

// Per lane l < W: the top eigenpair of the operator of lane l, given by
// apply(const V* x, V* y) -> mask_t<V> (false in a lane where it is undefined).
// o: the options shared by all lanes (k must be 1); stream[l]: lane l's
// random stream. start: lane l's warm start in lane l of start[0..D), used
// where has_start[l] (else a random start). Outputs per lane: evals[l],
// evecs[l * D ..] (unit, largest-magnitude entry positive), resid[l] (true
// residual norm), reports[l].
template <class V, class Apply>
PYSHARP_HD void lanczos_lanes(Apply& apply, int D, const LanczosOptions& o,
                              const std::uint64_t* stream, const V* start,
                              const bool* has_start, lane_real_t<V>* evals,
                              lane_real_t<V>* evecs, lane_real_t<V>* resid,
                              LanczosReport* reports, V* vscratch,
                              lane_real_t<V>* rscratch) {
  using Real = lane_real_t<V>;
  constexpr int W = lane_width<V>;
  const int m_max = o.max_iter;
  V* Q = vscratch;                                   // (m_max + 1) x D
  V* y = Q + static_cast<long long>(m_max + 1) * D;  // D
  V* alpha = y + D;                                  // m_max
  V* beta = alpha + m_max;                           // m_max
  V* d_all = beta + m_max;                           // every lane's T: m_max
  V* e_all = d_all + m_max;                          // m_max
  V* z_all = e_all + m_max;  // last eigenvector row, or the test's work: 2 m_max
  Real* d = rscratch;                                // one lane's T: m_max
  Real* e = d + m_max;                               // m_max
  Real* work = e + m_max;                            // the eigenvector solve: 5 m_max
  Real* coef = work + 5LL * m_max;                   // per lane: m_max + 1
  Real* q = coef + W * (m_max + 1LL);                // D: one lane's vector
  Real* qq = q + D;                                  // D
  int m_of[W];
  bool active[W];
  const Real unknown = Real(0) / Real(0);

  // Lane l stops at order m with top Ritz value theta (NaN: not yet known, a
  // stop without a convergence test at this order): the coefficients of its
  // vector by inverse iteration, O(m), rather than a second QL solve with the
  // eigenvector matrix.
  auto finish = [&](int l, int m, Real theta) {
    if (!(theta == theta)) {
      for (int i = 0; i < m; ++i) {
        d[i] = lane(alpha[i], l);
        e[i] = i + 1 < m ? lane(beta[i], l) : Real(0);
      }
      tridiagonal_eigh(m, d, e, static_cast<Real*>(nullptr), 0, 0);  // eigenvalues only
      theta = d[detail::next_largest(d, m, -1)];
    }
    evals[l] = theta;
    for (int i = 0; i < m; ++i) {
      d[i] = lane(alpha[i], l);
      e[i] = lane(beta[i], l);
    }
    tridiagonal_eigenvector(m, d, e, theta, coef + l * (m_max + 1LL), work);
    m_of[l] = m;
    reports[l].iterations = m;
    active[l] = false;
  };
  // Lane l's vector j of Q, as D Reals, and back.
  auto get = [&](int l, const V* x, Real* dst) {
    for (int i = 0; i < D; ++i) dst[i] = lane(x[i], l);
  };
  auto put = [&](int l, const Real* src, V* x) {
    for (int i = 0; i < D; ++i) set_lane(x[i], l, src[i]);
  };
  // A random unit vector of lane l orthogonal to its first j Krylov vectors.
  auto random_start = [&](int l, int j, std::uint64_t salt, V* dst) {
    LanczosOptions ol = o;
    ol.stream = stream[l];
    Real* Ql = rscratch;  // reuse d, e, work (unused while restarting) when large enough
    const bool fits = static_cast<long long>(j) * D <= 7LL * m_max;
    if (fits)
      for (int r = 0; r < j; ++r) get(l, Q + static_cast<long long>(r) * D, Ql + static_cast<long long>(r) * D);
    bool good;
    if (fits) {
      good = detail::random_orthonormal(q, Ql, j, D, ol, salt);
    } else {  // orthogonalise row by row
      good = detail::random_orthonormal(q, static_cast<const Real*>(nullptr), 0, D, ol, salt);
      for (int pass = 0; pass < 2 && good; ++pass)
        for (int r = 0; r < j; ++r) {
          get(l, Q + static_cast<long long>(r) * D, qq);
          const Real c = lane_dot(qq, q, D);
          for (int i = 0; i < D; ++i) q[i] -= c * qq[i];
        }
      if (good) {
        const Real nrm = sqrt_(lane_dot(q, q, D));
        good = nrm > Real(1e-3);
        for (int i = 0; i < D && good; ++i) q[i] /= nrm;
      }
    }
    if (good) put(l, q, dst);
    return good;
  };

  for (int l = 0; l < W; ++l) {
    reports[l] = LanczosReport();
    active[l] = true;
    m_of[l] = 0;
  }
  // Start vectors.
  const V nrm = start ? sqrt_(lane_dot(start, start, D)) : V(Real(0));
  for (int l = 0; l < W; ++l) {
    const bool warm = start && has_start[l] && lane(nrm, l) > Real(0);
    if (warm) {
      for (int i = 0; i < D; ++i) set_lane(Q[i], l, lane(start[i], l) / lane(nrm, l));
    } else if (!random_start(l, 0, 0, Q)) {
      reports[l].ok = false;
      active[l] = false;
    }
  }

  for (int j = 0; j < m_max; ++j) {
    bool any_active = false;
    for (int l = 0; l < W; ++l) any_active = any_active || active[l];
    if (!any_active) break;
    V* qj = Q + static_cast<long long>(j) * D;
    V* z = qj + D;
    const mask_t<V> defined = apply(qj, z);
    for (int l = 0; l < W; ++l)
      if (active[l] && !lane(defined, l)) {
        reports[l].ok = false;
        active[l] = false;
      }
    alpha[j] = lane_dot(qj, z, D);
    for (int i = 0; i < D; ++i) {
      z[i] -= alpha[j] * qj[i];
      if (j > 0) z[i] -= beta[j - 1] * qj[i - D];
    }
    for (int pass = 0; pass < 2; ++pass)  // full reorthogonalisation, twice is enough
      detail::project_out_blocked(z, Q, j + 1, D);
    beta[j] = sqrt_(lane_dot(z, z, D));
    const int m = j + 1;
    const bool last = m == m_max;
    const bool test = lanczos_tests_at(o, m, m_max);
    // The test's numbers for every active lane at once: the top Ritz value,
    // the last entry of its vector and ||T_m|| (tridiagonal_top_test, O(m)
    // per iteration); a lane it cannot vouch for gets T_m's full QL
    // decomposition instead, and a stopped lane a harmless matrix.
    V theta_all, z_top, norm_all;
    mask_t<V> fast = false, decomposed = true;
    if (test) {
      mask_t<V> live = false;
      for (int l = 0; l < W; ++l) set_lane(live, l, active[l]);
      for (int i = 0; i < m; ++i) {
        d_all[i] = select(live, alpha[i], V(Real(0)));
        e_all[i] = i + 1 < m ? select(live, beta[i], V(Real(1))) : V(Real(0));
      }
      fast = tridiagonal_top_test(m, d_all, e_all, &theta_all, &z_top, &norm_all, z_all);
      const mask_t<V> slow = live & !fast;
      if (any(slow)) {  // a stopped or vouched-for lane gets a zero matrix: nothing to rotate
        for (int i = 0; i < m; ++i) {
          d_all[i] = select(slow, alpha[i], V(Real(0)));
          e_all[i] = i + 1 < m ? select(slow, beta[i], V(Real(0))) : V(Real(0));
        }
        decomposed = tridiagonal_eigh(m, d_all, e_all, z_all, m - 1, 1) | !slow;
      }
    }
    mask_t<V> restarted = false;
    for (int l = 0; l < W; ++l) {
      if (!active[l]) continue;
      if (test) {
        if (!lane(decomposed, l)) {
          reports[l].ok = false;
          active[l] = false;
          continue;
        }
        Real theta, top, z_last;
        if (lane(fast, l)) {
          theta = lane(theta_all, l);
          top = lane(norm_all, l);
          z_last = lane(z_top, l);
        } else {
          for (int i = 0; i < m; ++i) d[i] = lane(d_all[i], l);
          const int best = detail::next_largest(d, m, -1);
          theta = d[best];
          z_last = lane(z_all[best], l);
          top = Real(0);
          for (int i = 0; i < m; ++i) top = fabs(d[i]) > top ? fabs(d[i]) : top;
        }
        const Real floor = top > Real(0) ? top : Real(1);
        reports[l].converged = lane(beta[j], l) * fabs(z_last) <= Real(o.tol) * floor;
        if (reports[l].converged || last) {
          finish(l, m, theta);
          continue;
        }
      }
      // Breakdown: the Krylov space is invariant; continue from a fresh random
      // direction orthogonal to it (T splits into blocks).
      const Real a = lane(alpha[j], l), b = j > 0 ? lane(beta[j - 1], l) : Real(0);
      const Real scale_ab = fabs(a) + b;
      const Real small = (sizeof(Real) == 8 ? Real(1e-12) : Real(1e-5)) *
                         (scale_ab > Real(0) ? scale_ab : Real(1));
      if (lane(beta[j], l) <= small) {
        set_lane(beta[j], l, Real(0));
        set_lane(restarted, l, true);
        if (m == D || !random_start(l, m, m, z)) {
          reports[l].converged = true;  // the whole space is spanned: T is exact
          finish(l, m, unknown);
        }
      }
    }
    const V safe = select(restarted, V(Real(1)), beta[j]);
    for (int i = 0; i < D; ++i) z[i] = z[i] / safe;
  }
  for (int l = 0; l < W; ++l)  // the cap was reached by a lane not yet stopped
    if (active[l]) finish(l, m_max, unknown);

  // Ritz vectors in SIMD: v = sum_r coef_r Q_r, then one operator application
  // gives every lane's true residual.
  V* v = y;
  int m_top = 0;
  for (int l = 0; l < W; ++l) m_top = m_of[l] > m_top ? m_of[l] : m_top;
  for (int i = 0; i < D; ++i) v[i] = V(Real(0));
  for (int r = 0; r < m_top; ++r) {
    // A lane that stopped before r has garbage (even NaN) in Q_r: mask it out
    // rather than multiplying it by 0.
    V c;
    mask_t<V> used = false;
    for (int l = 0; l < W; ++l) {
      set_lane(c, l, r < m_of[l] ? coef[l * (m_max + 1LL) + r] : Real(0));
      set_lane(used, l, r < m_of[l]);
    }
    const V* qr = Q + static_cast<long long>(r) * D;
    for (int i = 0; i < D; ++i) v[i] += select(used, c * qr[i], V(Real(0)));
  }
  const V vn = sqrt_(lane_dot(v, v, D));
  V sign = V(Real(1));
  for (int l = 0; l < W; ++l) {
    int arg = 0;
    for (int i = 0; i < D; ++i)
      if (fabs(lane(v[i], l)) > fabs(lane(v[arg], l))) arg = i;
    if (lane(v[arg], l) < Real(0)) set_lane(sign, l, Real(-1));
  }
  for (int i = 0; i < D; ++i) v[i] = v[i] / vn * sign;
  V* Av = Q;  // Q is no longer needed
  const mask_t<V> defined = apply(v, Av);
  V ev;
  for (int l = 0; l < W; ++l) set_lane(ev, l, evals[l]);
  V r2 = V(Real(0));
  for (int i = 0; i < D; ++i) r2 += (Av[i] - ev * v[i]) * (Av[i] - ev * v[i]);
  for (int l = 0; l < W; ++l) {
    if (!lane(defined, l)) reports[l].ok = false;
    resid[l] = sqrt_(lane(r2, l));
    for (int i = 0; i < D; ++i) evecs[static_cast<long long>(l) * D + i] = lane(v[i], l);
  }
}

}  // namespace pysharp
