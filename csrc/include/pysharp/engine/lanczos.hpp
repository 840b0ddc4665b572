// Lanczos with full reorthogonalisation for the k largest (algebraic)
// eigenvalues of a symmetric operator given only by its matrix-vector product.
#pragma once

#include <cstdint>

#include "pysharp/engine/rng.hpp"
#include "pysharp/engine/tridiagonal.hpp"

namespace pysharp {

struct LanczosOptions {
  int k = 1;           // eigenpairs wanted
  int max_iter = 0;    // Krylov dimension cap (<= D)
  int min_iter = 0;    // never stop before this many steps (guards early false convergence)
  double tol = 1e-10;  // relative residual estimate beta_m |z_m| / max(|theta_1|, tiny)
  std::uint64_t seed = 0, stream = 0, counter = 0;  // key of the random start / restarts
};

struct LanczosReport {
  int iterations = 0;
  bool converged = false;
  bool ok = true;  // false when the operator failed (undefined point)
};

// Scratch sizes in Reals for dimension D and options o.
PYSHARP_HD inline long long lanczos_scratch_size(int D, const LanczosOptions& o) {
  const long long m = o.max_iter;
  return (m + 1) * D + 3 * m + m * m + 2 * D;
}

namespace detail {
template <class Real>
PYSHARP_HD Real dot(const Real* a, const Real* b, int n) {
  Real s = Real(0);
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Fills q with a random vector orthogonal to Q[0..j) and normalises it.
template <class Real>
PYSHARP_HD bool random_orthonormal(Real* q, const Real* Q, int j, int D,
                                   const LanczosOptions& o, std::uint64_t salt) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    for (int i = 0; i < D; ++i)
      q[i] = static_cast<Real>(normal(o.seed, o.stream, o.counter ^ (salt << 32),
                                      static_cast<std::uint64_t>(attempt) * D + i));
    for (int pass = 0; pass < 2; ++pass)
      for (int l = 0; l < j; ++l) {
        const Real c = dot(Q + static_cast<long long>(l) * D, q, D);
        for (int i = 0; i < D; ++i) q[i] -= c * Q[static_cast<long long>(l) * D + i];
      }
    const Real nrm = sqrt_(dot(q, q, D));
    if (nrm > Real(1e-3)) {
      for (int i = 0; i < D; ++i) q[i] /= nrm;
      return true;
    }
  }
  return false;
}
}  // namespace detail

// Runs Lanczos on `apply` (bool apply(const Real* x, Real* y): y = A x).
// start: initial vector (length D) or nullptr for a random one.
// Outputs: evals (k, descending), evecs (k x D, row i = unit eigenvector i,
// sign fixed so its largest-magnitude entry is positive), resid (k) the true
// residual norms ||A y - theta y||. scratch: lanczos_scratch_size(D, o).
template <class Real, class Apply>
PYSHARP_HD LanczosReport lanczos(Apply&& apply, int D, const LanczosOptions& o,
                                 const Real* start, Real* evals, Real* evecs, Real* resid,
                                 Real* scratch) {
  LanczosReport rep;
  const int m_max = o.max_iter;
  const int k = o.k;
  Real* Q = scratch;                                  // (m_max + 1) x D
  Real* alpha = Q + static_cast<long long>(m_max + 1) * D;
  Real* beta = alpha + m_max;
  Real* dwork = beta + m_max;                         // eigenvalues of T
  Real* Z = dwork + m_max;                            // m_max x m_max
  Real* ework = Z + static_cast<long long>(m_max) * m_max;  // D
  Real* y = ework + D;                                // D

  // Start vector.
  Real nrm = Real(0);
  if (start) {
    for (int i = 0; i < D; ++i) Q[i] = start[i];
    nrm = sqrt_(detail::dot(Q, Q, D));
  }
  if (start && nrm > Real(0)) {
    for (int i = 0; i < D; ++i) Q[i] /= nrm;
  } else if (!detail::random_orthonormal(Q, Q, 0, D, o, 0)) {
    rep.ok = false;
    return rep;
  }

  int m = 0;
  for (int j = 0; j < m_max; ++j) {
    Real* qj = Q + static_cast<long long>(j) * D;
    Real* z = qj + D;
    if (!apply(qj, z)) {
      rep.ok = false;
      return rep;
    }
    alpha[j] = detail::dot(qj, z, D);
    for (int i = 0; i < D; ++i) {
      z[i] -= alpha[j] * qj[i];
      if (j > 0) z[i] -= beta[j - 1] * qj[i - D];
    }
    for (int pass = 0; pass < 2; ++pass)  // full reorthogonalisation, twice is enough
      for (int l = 0; l <= j; ++l) {
        const Real* ql = Q + static_cast<long long>(l) * D;
        const Real c = detail::dot(ql, z, D);
        for (int i = 0; i < D; ++i) z[i] -= c * ql[i];
      }
    beta[j] = sqrt_(detail::dot(z, z, D));
    m = j + 1;

    bool done = (m == m_max);
    if (m >= k && (m >= o.min_iter || done)) {
      for (int i = 0; i < m; ++i) {
        dwork[i] = alpha[i];
        ework[i] = i + 1 < m ? beta[i] : Real(0);
      }
      if (!tridiagonal_eigh(m, dwork, ework, Z)) {
        rep.ok = false;
        return rep;
      }
      // Residual estimates of the k largest Ritz values: beta_m |Z[m-1, i]|.
      Real top = Real(0);
      for (int i = 0; i < m; ++i) top = fabs(dwork[i]) > top ? fabs(dwork[i]) : top;
      const Real floor = top > Real(0) ? top : Real(1);
      bool all = true;
      bool taken[1024] = {};
      for (int t = 0; t < k && t < m; ++t) {
        int best = -1;
        for (int i = 0; i < m; ++i)
          if (!taken[i] && (best < 0 || dwork[i] > dwork[best])) best = i;
        taken[best] = true;
        if (beta[j] * fabs(Z[(m - 1) * m + best]) > Real(o.tol) * floor) all = false;
      }
      rep.converged = all;
      done = done || all;
    }
    if (done) break;
    // Breakdown: the Krylov space is invariant. Continue from a fresh random
    // direction orthogonal to it; T then splits into blocks.
    const Real scale_ab = fabs(alpha[j]) + (j > 0 ? beta[j - 1] : Real(0));
    const Real small = (sizeof(Real) == 8 ? Real(1e-12) : Real(1e-5)) *
                       (scale_ab > Real(0) ? scale_ab : Real(1));
    if (beta[j] <= small) {
      beta[j] = Real(0);
      if (m == D || !detail::random_orthonormal(z, Q, m, D, o, m)) {
        rep.converged = true;  // the whole space is spanned: T is exact
        // Recompute the decomposition with beta[j] = 0 on the next pass.
        for (int i = 0; i < m; ++i) {
          dwork[i] = alpha[i];
          ework[i] = i + 1 < m ? beta[i] : Real(0);
        }
        tridiagonal_eigh(m, dwork, ework, Z);
        break;
      }
    } else {
      for (int i = 0; i < D; ++i) z[i] /= beta[j];
    }
  }
  rep.iterations = m;

  // Ritz pairs, largest first, with true residuals.
  bool taken[1024] = {};
  for (int t = 0; t < k; ++t) {
    int best = -1;
    for (int i = 0; i < m; ++i)
      if (!taken[i] && (best < 0 || dwork[i] > dwork[best])) best = i;
    if (best < 0) {  // fewer Ritz values than k (k > D is refused upstream)
      evals[t] = Real(0) / Real(0);
      resid[t] = evals[t];
      continue;
    }
    taken[best] = true;
    evals[t] = dwork[best];
    Real* v = evecs + static_cast<long long>(t) * D;
    for (int i = 0; i < D; ++i) v[i] = Real(0);
    for (int l = 0; l < m; ++l) {
      const Real c = Z[l * m + best];
      const Real* ql = Q + static_cast<long long>(l) * D;
      for (int i = 0; i < D; ++i) v[i] += c * ql[i];
    }
    const Real vn = sqrt_(detail::dot(v, v, D));
    int arg = 0;
    for (int i = 0; i < D; ++i) {
      v[i] /= vn;
      if (fabs(v[i]) > fabs(v[arg])) arg = i;
    }
    if (v[arg] < Real(0))
      for (int i = 0; i < D; ++i) v[i] = -v[i];
    if (!apply(v, y)) {
      rep.ok = false;
      return rep;
    }
    Real r2 = Real(0);
    for (int i = 0; i < D; ++i) r2 += (y[i] - evals[t] * v[i]) * (y[i] - evals[t] * v[i]);
    resid[t] = sqrt_(r2);
  }
  return rep;
}

}  // namespace pysharp
