// Lanczos with full reorthogonalisation for the k largest (or smallest)
// algebraic eigenvalues of a symmetric operator given only by its
// matrix-vector product, with locking so that k > 1 resolves multiplicity.
//
// A single Krylov sequence holds one vector per distinct eigenvalue (in exact
// arithmetic the start vector's projection onto an eigenspace is all it ever
// sees of it), so plain Lanczos returns a multiple eigenvalue once and fills
// the remaining slots with lower ones while reporting convergence. For k > 1
// the k returned pairs are therefore locked and Lanczos is re-run, from a
// fresh random start, on the orthogonal complement of the locked vectors: a
// complement Ritz value above the current k-th value is a missed eigenpair;
// it is merged in (the k-th dropped) and the check repeats. k = 1 runs the
// plain recurrence only: its bits are those the trajectory engine records.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/engine/rng.hpp"
#include "pysharp/engine/tridiagonal.hpp"

namespace pysharp {

// Krylov dimension cap of one Lanczos run (the Python layer checks the same).
inline constexpr int kLanczosMaxIter = 1024;

struct LanczosOptions {
  int k = 1;               // eigenpairs wanted
  int max_iter = 0;        // Krylov dimension cap of one run (<= D, <= kLanczosMaxIter)
  int min_iter = 0;        // never stop before this many steps (guards early false convergence)
  double tol = 1e-10;      // relative residual, see LanczosReport::converged
  bool smallest = false;   // the k smallest algebraic eigenvalues (Lanczos on -A)
  std::uint64_t seed = 0, stream = 0, counter = 0;  // key of the random start / restarts
};

// Whether a run tests convergence after step m (m_max: its cap): at the cap,
// and from min_iter on every other step. A test is a QL solve of T_m, which at
// the orders used here costs more than a step (one operator application and
// the reorthogonalisation); a run then stops at most one step after its
// residual estimate first passes, so never less accurate. Testing every step
// made batched spherical_sharpness (d 40) 1.27x slower.
PYSHARP_HD inline bool lanczos_tests_at(const LanczosOptions& o, int m, int m_max) {
  return m == m_max || (m >= o.min_iter && (m - o.min_iter) % 2 == 0);
}

struct LanczosReport {
  int iterations = 0;      // Krylov steps, summed over the runs (k > 1 adds check runs)
  // k = 1: the Ritz residual estimate beta_m |z_m| <= tol * max(|theta|, tiny).
  // k > 1: every returned pair's true residual <= tol * (largest |Ritz value|
  // seen) and the last complement run converged without finding a missed pair.
  bool converged = false;
  bool ok = true;  // false when the operator failed (undefined point)
};

namespace detail {
// Reals of one run's workspace with Krylov cap m: Q, alpha, beta, T's
// eigen-decomposition and two D-vectors.
PYSHARP_HD inline long long lanczos_run_scratch(int D, int m_max) {
  const long long m = m_max;
  return (m + 1) * D + 3 * m + m * m + 2 * D;
}
}  // namespace detail

// Scratch sizes in Reals for dimension D and options o (k > 1 adds one
// candidate pair for the complement runs).
PYSHARP_HD inline long long lanczos_scratch_size(int D, const LanczosOptions& o) {
  return detail::lanczos_run_scratch(D, o.max_iter) + (o.k > 1 ? D + 2 : 0);
}

namespace detail {
// Salts of the complement runs' random streams sit above every restart salt.
inline constexpr std::uint64_t kRoundSalt = 2048;
static_assert(kLanczosMaxIter < static_cast<int>(kRoundSalt), "restart salts must not collide");

// q -= sum_l (B_l . q) B_l over the n rows of B (one Gram-Schmidt pass).
template <class Real>
PYSHARP_HD void project_out(Real* q, const Real* B, int n, int D) {
  for (int l = 0; l < n; ++l) {
    const Real* bl = B + static_cast<long long>(l) * D;
    const Real c = lane_dot(bl, q, D);
    for (int i = 0; i < D; ++i) q[i] -= c * bl[i];
  }
}

// Fills q with a random vector orthogonal to the locked rows L[0..nL) and to
// Q[0..j), and normalises it.
template <class Real>
PYSHARP_HD bool random_orthonormal(Real* q, const Real* Q, int j, int D,
                                   const LanczosOptions& o, std::uint64_t salt,
                                   const Real* L = nullptr, int nL = 0) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    for (int i = 0; i < D; ++i)
      q[i] = static_cast<Real>(normal(o.seed, o.stream, o.counter ^ (salt << 32),
                                      static_cast<std::uint64_t>(attempt) * D + i));
    for (int pass = 0; pass < 2; ++pass) {
      project_out(q, L, nL, D);
      project_out(q, Q, j, D);
    }
    const Real nrm = sqrt_(lane_dot(q, q, D));
    if (nrm > Real(1e-3)) {
      for (int i = 0; i < D; ++i) q[i] /= nrm;
      return true;
    }
  }
  return false;
}

// The Ritz value after `prev` in the order (value descending, index
// ascending); prev = -1 gives the largest. -1 when none is left.
template <class Real>
PYSHARP_HD int next_largest(const Real* d, int m, int prev) {
  int best = -1;
  for (int i = 0; i < m; ++i) {
    if (prev >= 0 && !(d[i] < d[prev] || (d[i] == d[prev] && i > prev))) continue;
    if (best < 0 || d[i] > d[best]) best = i;
  }
  return best;
}

// y = -A x: Lanczos on -A gives the smallest eigenvalues of A.
template <class F>
struct Negated {
  F* f;
  int D;
  template <class Real>
  PYSHARP_HD bool operator()(const Real* x, Real* y) const {
    if (!(*f)(x, y)) return false;
    for (int i = 0; i < D; ++i) y[i] = -y[i];
    return true;
  }
};
template <class F>
PYSHARP_HD Negated<F> negated(F& f, int D) {
  return Negated<F>{&f, D};
}

// One Lanczos run for the k largest eigenpairs of A restricted to the
// orthogonal complement of the nL orthonormal rows of L (nL = 0: all of R^D).
// m_max: Krylov cap (<= D - nL). floor_min: lower bound of the residual
// scale (0: the run's own largest |Ritz value|). salt: random-stream salt of
// the start and the restarts. spread: largest |Ritz value| of the last T.
// Outputs and scratch as in lanczos().
template <class Real, class Apply>
PYSHARP_HD LanczosReport lanczos_run(Apply& apply, int D, const LanczosOptions& o, int k,
                                     int m_max, const Real* start, const Real* L, int nL,
                                     Real floor_min, std::uint64_t salt, Real* evals,
                                     Real* evecs, Real* resid, Real* scratch, Real* spread) {
  LanczosReport rep;
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
    nrm = sqrt_(lane_dot(Q, Q, D));
  }
  if (start && nrm > Real(0)) {
    for (int i = 0; i < D; ++i) Q[i] /= nrm;
  } else if (!random_orthonormal(Q, Q, 0, D, o, salt, L, nL)) {
    rep.ok = false;
    return rep;
  }

  int m = 0;
  // T of order m into dwork, ework; its eigenvalues and `rows` rows of its
  // eigenvectors from first_row on (tridiagonal_eigh).
  auto decompose = [&](int first_row, int rows) {
    for (int i = 0; i < m; ++i) {
      dwork[i] = alpha[i];
      ework[i] = i + 1 < m ? beta[i] : Real(0);
    }
    return tridiagonal_eigh(m, dwork, ework, Z, first_row, rows);
  };
  for (int j = 0; j < m_max; ++j) {
    Real* qj = Q + static_cast<long long>(j) * D;
    Real* z = qj + D;
    if (!apply(qj, z)) {
      rep.ok = false;
      return rep;
    }
    alpha[j] = lane_dot(qj, z, D);
    for (int i = 0; i < D; ++i) {
      z[i] -= alpha[j] * qj[i];
      if (j > 0) z[i] -= beta[j - 1] * qj[i - D];
    }
    for (int pass = 0; pass < 2; ++pass) {  // full reorthogonalisation, twice is enough
      project_out(z, L, nL, D);
      project_out(z, Q, j + 1, D);
    }
    beta[j] = sqrt_(lane_dot(z, z, D));
    m = j + 1;

    bool done = (m == m_max);
    if (m >= k && lanczos_tests_at(o, m, m_max)) {
      if (!decompose(m - 1, 1)) {  // the last row suffices
        rep.ok = false;
        return rep;
      }
      // Residual estimates of the k largest Ritz values: beta_m |Z[m-1, i]|.
      Real top = Real(0);
      for (int i = 0; i < m; ++i) top = fabs(dwork[i]) > top ? fabs(dwork[i]) : top;
      const Real floor = top > floor_min ? top : (floor_min > Real(0) ? floor_min : Real(1));
      bool all = true;
      for (int t = 0, best = -1; t < k && t < m; ++t) {
        best = next_largest(dwork, m, best);
        if (beta[j] * fabs(Z[best]) > Real(o.tol) * floor) all = false;
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
      if (m + nL >= D || !random_orthonormal(z, Q, m, D, o, salt + m, L, nL)) {
        rep.converged = true;  // the whole space is spanned: T is exact
        break;
      }
    } else {
      for (int i = 0; i < D; ++i) z[i] /= beta[j];
    }
  }
  rep.iterations = m;
  // The Ritz vectors need every row of T's eigenvectors: one full decomposition,
  // whose eigenvalues are those the last test saw, bit for bit.
  decompose(0, m);
  Real top = Real(0);
  for (int i = 0; i < m; ++i) top = fabs(dwork[i]) > top ? fabs(dwork[i]) : top;
  *spread = top;

  // Ritz pairs, largest first, with true residuals.
  for (int t = 0, best = -1; t < k; ++t) {
    best = (t > 0 && best < 0) ? -1 : next_largest(dwork, m, best);  // -1 stays -1
    if (best < 0) {  // fewer Ritz values than k (k > D is refused upstream)
      evals[t] = Real(0) / Real(0);
      resid[t] = evals[t];
      continue;
    }
    evals[t] = dwork[best];
    Real* v = evecs + static_cast<long long>(t) * D;
    for (int i = 0; i < D; ++i) v[i] = Real(0);
    for (int l = 0; l < m; ++l) {
      const Real c = Z[l * m + best];
      const Real* ql = Q + static_cast<long long>(l) * D;
      for (int i = 0; i < D; ++i) v[i] += c * ql[i];
    }
    const Real vn = sqrt_(lane_dot(v, v, D));
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

// The k largest eigenpairs of A: one run, then for k > 1 complement runs
// (k = 1 each) until the complement holds nothing above the k-th value. Each
// merged pair is the top of a complement that only shrinks (bar dropped,
// lower, pairs), so it is never displaced again: k merges and one check, at
// most k + 1 complement runs.
template <class Real, class Apply>
PYSHARP_HD LanczosReport lanczos_locked(Apply& apply, int D, const LanczosOptions& o,
                                        const Real* start, Real* evals, Real* evecs,
                                        Real* resid, Real* scratch) {
  const int k = o.k;
  Real scale = Real(0);
  LanczosReport rep = lanczos_run(apply, D, o, k, o.max_iter, start,
                                  static_cast<const Real*>(nullptr), 0, Real(0),
                                  std::uint64_t(0), evals, evecs, resid, scratch, &scale);
  if (k == 1 || !rep.ok) return rep;
  Real* cvec = scratch + lanczos_run_scratch(D, o.max_iter);  // D
  Real* cval = cvec + D;                                       // 1
  Real* cres = cval + 1;                                       // 1
  const Real eps = machine_eps<Real>();
  const Real rel = Real(o.tol) > Real(100) * eps ? Real(o.tol) : Real(100) * eps;
  const int m_c = o.max_iter < D - k ? o.max_iter : D - k;
  bool settled = m_c < 1;  // k = D: no complement, nothing to miss
  bool check_converged = settled;
  for (int round = 1; !settled && round <= k + 1; ++round) {
    Real s = Real(0);
    const LanczosReport sub = lanczos_run(apply, D, o, 1, m_c, static_cast<const Real*>(nullptr),
                                          static_cast<const Real*>(evecs), k, scale,
                                          kRoundSalt * round, cval, cvec, cres, scratch, &s);
    rep.iterations += sub.iterations;
    if (!sub.ok) {
      rep.ok = false;
      rep.converged = false;
      return rep;
    }
    scale = s > scale ? s : scale;
    if (!(cval[0] > evals[k - 1] + rel * scale)) {  // nothing above the k-th value
      settled = true;
      check_converged = sub.converged;
      break;
    }
    int p = k - 1;  // merge: insert in descending order, drop the k-th
    while (p > 0 && evals[p - 1] < cval[0]) --p;
    for (int t = k - 1; t > p; --t) {
      evals[t] = evals[t - 1];
      resid[t] = resid[t - 1];
      Real* dst = evecs + static_cast<long long>(t) * D;
      for (int i = 0; i < D; ++i) dst[i] = dst[i - D];
    }
    evals[p] = cval[0];
    resid[p] = cres[0];
    Real* dst = evecs + static_cast<long long>(p) * D;
    for (int i = 0; i < D; ++i) dst[i] = cvec[i];
  }
  bool conv = settled && check_converged;
  for (int t = 0; t < k; ++t)
    if (!(resid[t] <= Real(o.tol) * scale)) conv = false;
  rep.converged = conv;
  return rep;
}
}  // namespace detail

// Runs Lanczos on `apply` (bool apply(const Real* x, Real* y): y = A x).
// start: initial vector (length D) or nullptr for a random one.
// Outputs: evals (k; descending, or ascending with o.smallest), evecs (k x D,
// row i = unit eigenvector i, sign fixed so its largest-magnitude entry is
// positive), resid (k) the true residual norms ||A y - theta y||.
// scratch: lanczos_scratch_size(D, o).
template <class Real, class Apply>
PYSHARP_HD LanczosReport lanczos(Apply&& apply, int D, const LanczosOptions& o,
                                 const Real* start, Real* evals, Real* evecs, Real* resid,
                                 Real* scratch) {
  if (!o.smallest) return detail::lanczos_locked(apply, D, o, start, evals, evecs, resid, scratch);
  auto neg = detail::negated(apply, D);
  const LanczosReport rep = detail::lanczos_locked(neg, D, o, start, evals, evecs, resid, scratch);
  for (int t = 0; t < o.k; ++t) evals[t] = -evals[t];
  return rep;
}

}  // namespace pysharp
