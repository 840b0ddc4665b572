// Stochastic Lanczos quadrature (SLQ) of a Hessian's spectral density.
//
// For a unit start vector q, m Lanczos steps on H give the tridiagonal T_m;
// its eigenvalues (nodes) and the squared first components of its unit
// eigenvectors (weights) form the m-point Gauss quadrature of the measure
// sum_i (q . u_i)^2 delta(t - lambda_i): sum_j w_j f(t_j) = q^T f(H) q for every
// polynomial f of degree < 2m. With q a normalised Rademacher probe,
// E q^T f(H) q = tr f(H) / D, so the average over probes estimates the
// spectral density (Ubaru, Chen & Saad 2017; Ghorbani, Krishnan & Xiao 2019).
//
// The recurrence runs on any value type S the models accept: a plain Real
// (one problem) or a lane block (core/lanes.hpp, one problem per lane). All
// arithmetic is lane-wise, so a problem's bits do not depend on its lane.
#pragma once

#include <cstdint>

#include "pysharp/engine/rng.hpp"
#include "pysharp/engine/tridiagonal.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp {

// Stream of the SLQ probes in the counter-based RNG: probe p, entry i is
// rademacher(seed, kSlqStream, p, i), whatever point it is applied to.
inline constexpr std::uint64_t kSlqStream = 0x534c51;  // "SLQ"

// +1 or -1 with probability 1/2 each, from the top bit of the key's hash.
PYSHARP_HD inline double rademacher(std::uint64_t seed, std::uint64_t stream,
                                    std::uint64_t counter, std::uint64_t index) {
  return (hash4(seed, stream, counter, index) >> 63) ? 1.0 : -1.0;
}

// Scratch, in values of S, of slq_lanczos: the Lanczos basis (steps + 1) x D.
PYSHARP_HD inline long long slq_basis_size(int D, int steps) {
  return static_cast<long long>(steps + 1) * D;
}

// Lanczos with full reorthogonalisation (two Gram-Schmidt passes a step) on
// H(w), from the start vector in Q[0..D) (any nonzero vector; normalised here).
// Q: slq_basis_size(D, steps) values; jets: jet_scratch_size(m) jets.
// Writes alpha[0..steps), beta[0..steps) and count[l] per lane: the Lanczos
// steps m_l that lane l took. T of lane l is tridiag(beta[0..m_l-1),
// alpha[0..m_l), beta[0..m_l-1)); beta[m_l - 1] is the final residual norm,
// 0 when the Krylov space became invariant (breakdown: the quadrature is then
// exact and the lane stops; its later alpha and beta are 0).
// Returns the lanes where the model was defined at w.
template <class Model, class S>
PYSHARP_HD mask_t<S> slq_lanczos(const Model& m, const S* w, int steps, S* Q, Jet<S, 1>* jets,
                                 S* alpha, S* beta, int* count) {
  using Real = lane_real_t<S>;
  constexpr int L = lane_width<S>;
  const int D = m.dim();
  const S inv0 = S(Real(1)) / sqrt_(lane_dot(Q, Q, D));
  for (int i = 0; i < D; ++i) Q[i] *= inv0;
  bool active[L];
  for (int l = 0; l < L; ++l) {
    active[l] = true;
    count[l] = steps;
  }
  const Real tiny = sizeof(Real) == 8 ? Real(1e-12) : Real(1e-5);  // as lanczos.hpp
  mask_t<S> ok(true);
  for (int j = 0; j < steps; ++j) {
    const S* q = Q + static_cast<long long>(j) * D;
    S* z = Q + static_cast<long long>(j + 1) * D;
    ok = ok & hvp(m, w, q, z, jets);
    const S a = lane_dot(q, z, D);
    const S b_prev = j > 0 ? beta[j - 1] : S(Real(0));
    for (int i = 0; i < D; ++i) {
      z[i] -= a * q[i];
      if (j > 0) z[i] -= b_prev * q[i - D];
    }
    for (int pass = 0; pass < 2; ++pass)
      for (int k = 0; k <= j; ++k) {
        const S* qk = Q + static_cast<long long>(k) * D;
        const S c = lane_dot(qk, z, D);
        for (int i = 0; i < D; ++i) z[i] -= c * qk[i];
      }
    S b = sqrt_(lane_dot(z, z, D));
    S a_out = a, inv(Real(0));
    for (int l = 0; l < L; ++l) {
      const Real al = lane(a, l), bl = lane(b, l), bp = lane(b_prev, l);
      if (!active[l]) {  // stopped earlier: its basis vectors are zero
        set_lane(a_out, l, Real(0));
        set_lane(b, l, Real(0));
        continue;
      }
      const Real scale = (al < 0 ? -al : al) + bp;
      if (bl <= tiny * (scale > Real(0) ? scale : Real(1))) {  // invariant subspace
        active[l] = false;
        count[l] = j + 1;
        set_lane(b, l, Real(0));
      } else {
        set_lane(inv, l, Real(1) / bl);
      }
    }
    alpha[j] = a_out;
    beta[j] = b;
    for (int i = 0; i < D; ++i) z[i] *= inv;
  }
  return ok;
}

// Gauss quadrature from the m x m tridiagonal T: d (m) the diagonal,
// overwritten with the nodes in ascending order; e (m) with e[i] coupling i and
// i+1 (destroyed); weights (m) the squared first components of T's unit
// eigenvectors (summing to 1), from tridiagonal_eigh tracking only the first
// row (Golub-Welsch): O(m^2). Returns false if an eigenvalue fails to converge.
template <class Real>
PYSHARP_HD bool gauss_quadrature(int m, Real* d, Real* e, Real* weights) {
  if (m <= 0) return true;
  if (!tridiagonal_eigh(m, d, e, weights, 0, 1)) return false;
  for (int c = 0; c < m; ++c) weights[c] *= weights[c];
  for (int c = 1; c < m; ++c) {  // insertion sort by node (m is small)
    const Real x = d[c], y = weights[c];
    int k = c - 1;
    for (; k >= 0 && d[k] > x; --k) {
      d[k + 1] = d[k];
      weights[k + 1] = weights[k];
    }
    d[k + 1] = x;
    weights[k + 1] = y;
  }
  return true;
}

}  // namespace pysharp
