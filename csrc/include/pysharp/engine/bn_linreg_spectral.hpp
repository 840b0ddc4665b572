// GD+WD on BN linear regression in the singular basis of Xc: an exact
// reduced form of the same update, O(r) per step instead of O(n d).
//
// With the thin SVD Xc = U diag(sigma) V^T of rank r, split
// w = V a + w_perp (w_perp in the null space of Xc) and set b = sigma * a,
// so that z = Xc w = U b and, with ut = U^T u, the loss and its gradient in b are
//     L = (scale/2) (||b/||b|| - ut||^2 + ||u_perp||^2),
//     grad_b L = scale (cos b/||b|| - ut) / ||b||,   cos = ut . b / ||b||,
// and grad L(w) = V (sigma * grad_b L). GD+WD therefore maps to
//     b+ = decay b - step sigma^2 * grad_b L,   w_perp+ = decay w_perp,
// with ||w||^2 = ||b / sigma||^2 + c^2 ||w_perp(0)||^2, c = decay^t.
// The reduced loss is the BN cosine loss (core/bn_cosine.hpp) restricted to
// the column space of Xc, written out so that no n-vector is ever formed.
#pragma once

#include "pysharp/engine/trajectory.hpp"
#include "pysharp/models/bn_linear_regression.hpp"

namespace pysharp {

template <class Real>
struct BNLinRegSpectral {
  const Real* sigma;  // (r,) singular values of Xc, all > 0
  const Real* inv_sigma;  // (r,) 1 / sigma
  const Real* sigma2;     // (r,) sigma^2
  const Real* ut;     // (r,) U^T u
  const Real* V;      // (d, r) row-major right singular vectors
  Real uperp2;        // ||u - U ut||^2, the part of the target no w can fit
  Real xc_fro2;       // ||Xc||_F^2 = sum sigma^2
  Real scale;         // 2 var(y)
  int r;
  int d;
};

template <class Real>
struct SpectralState {
  const BNLinRegSpectral<Real>& s;  // b and c are public: lockstep drivers move them
  Real* b;       // (r,)
  Real* gb;      // (r,) grad_b L at b
  Real* wperp0;  // (d,) null-space part of w0
  Real* w;       // (d,) w, rebuilt on demand by point()
  Real c = Real(1);
  Real perp2;    // ||w_perp(0)||^2
  Real point_scale = Real(1);  // point() returns point_scale w (scale_point)

  PYSHARP_HD static long long scratch_size(const BNLinRegSpectral<Real>& sp) {
    return 2LL * sp.r + 2LL * sp.d;
  }
  PYSHARP_HD SpectralState(const BNLinRegSpectral<Real>& sp, const Real* w0, Real* scratch)
      : s(sp), b(scratch), gb(scratch + sp.r), wperp0(scratch + 2 * sp.r),
        w(scratch + 2 * sp.r + sp.d) {
    for (int i = 0; i < s.d; ++i) wperp0[i] = w0[i];
    for (int k = 0; k < s.r; ++k) {
      Real a = Real(0);
      for (int i = 0; i < s.d; ++i) a += s.V[i * s.r + k] * w0[i];
      b[k] = s.sigma[k] * a;
      for (int i = 0; i < s.d; ++i) wperp0[i] -= s.V[i * s.r + k] * a;
    }
    perp2 = lane_dot(wperp0, wperp0, s.d);
  }
  // The reduced coordinates hold any norm whose square is finite (starts outside SafeNorm2's
  // range run in the full space, pysharp/dynamics.py), but the runner's Lanczos takes HVPs
  // at point(): a run that drifts outside gets the power of two `scale` that brings
  // ||w|| to order one, and point() returns scale w while the runner asks for it.
  PYSHARP_HD void scale_point(Real f) { point_scale *= f; }
  PYSHARP_HD bool evaluate(Real& loss, Real& norm2, Real& gnorm2, Real& scale, bool) {
    const bool ok = evaluate_unscaled(loss, norm2, gnorm2);
    scale = Real(1);
    if (ok && !(norm2 > SafeNorm2<Real>::lo && norm2 < SafeNorm2<Real>::hi) &&
        is_finite(norm2) && norm2 > Real(0)) {
      int e = 0;
      frexp(static_cast<double>(norm2), &e);
      scale = static_cast<Real>(ldexp(1.0, -(e / 2)));
      norm2 = norm2 * scale * scale;    // ||s w||^2
      gnorm2 = gnorm2 / scale / scale;  // ||grad L(s w)||^2
    }
    return ok;
  }
  PYSHARP_HD bool evaluate_unscaled(Real& loss, Real& norm2, Real& gnorm2) {
    Real r2 = Real(0), dot_ub = Real(0), a2 = Real(0);
    for (int k = 0; k < s.r; ++k) {
      r2 += b[k] * b[k];
      dot_ub += s.ut[k] * b[k];
      const Real a = b[k] * s.inv_sigma[k];
      a2 += a * a;
    }
    // Xc w = 0 to working precision: BatchNorm undefined (as in the direct model).
    const Real err = Real(s.d) * machine_eps<Real>();
    if (!(r2 > err * err * s.xc_fro2 * (a2 + c * c * perp2))) return false;
    const Real inv_r = Real(1) / sqrt_(r2);
    const Real cos_zu = dot_ub * inv_r;
    Real err2 = s.uperp2, g2 = Real(0);
    for (int k = 0; k < s.r; ++k) {
      const Real bh = b[k] * inv_r;
      const Real e = bh - s.ut[k];
      err2 += e * e;
      gb[k] = (cos_zu * bh - s.ut[k]) * inv_r * s.scale;
      const Real ga = s.sigma[k] * gb[k];
      g2 += ga * ga;
    }
    loss = err2 * (Real(0.5) * s.scale);
    norm2 = a2 + c * c * perp2;
    gnorm2 = g2;
    return true;
  }
  PYSHARP_HD const Real* point() const {
    for (int i = 0; i < s.d; ++i) {
      Real acc = c * wperp0[i];
      for (int k = 0; k < s.r; ++k) acc += s.V[i * s.r + k] * (b[k] * s.inv_sigma[k]);
      w[i] = point_scale == Real(1) ? acc : acc * point_scale;
    }
    return w;
  }
  PYSHARP_HD Real grad_dot(int /*lane*/, const Real* v) const {  // v . V (sigma * gb)
    Real acc = Real(0);
    for (int k = 0; k < s.r; ++k) {
      Real vk = Real(0);
      for (int i = 0; i < s.d; ++i) vk += v[i] * s.V[i * s.r + k];
      acc += vk * s.sigma[k] * gb[k];
    }
    return acc;
  }
  // Jitter and the sphere methods need the full space; callers choose
  // FullSpaceState for those (the Python layer does).
  PYSHARP_HD bool advance(bool /*live*/, bool /*sphere*/, Real decay, Real step, Real /*norm*/,
                          Real /*jitter_amp*/, std::uint64_t, const long long*, long long) {
    bool finite = true;
    for (int k = 0; k < s.r; ++k) {
      const Real nb = decay * b[k] - step * s.sigma2[k] * gb[k];
      finite = finite && is_finite(nb);
      gb[k] = nb;
    }
    if (!finite) return false;
    for (int k = 0; k < s.r; ++k) b[k] = gb[k];
    c *= decay;
    return true;
  }
};

// Advances L independent lanes of plain GD+WD by n steps in the singular
// basis, vectorised across lanes (trajectories) rather than within one: the
// per-step reductions over k are then lane-parallel instead of a latency
// chain. b: r x L, lane fastest; c: the null-space factors decay^t. A lane's
// arithmetic never involves another lane, so results do not depend on how
// trajectories are grouped into lanes.
template <int L, class Real>
PYSHARP_HD void spectral_gd_wd_lanes(const BNLinRegSpectral<Real>& s, Real* b, Real* c,
                                     const Real* decay, const Real* lr, long long n) {
  const int r = s.r;
  for (long long t = 0; t < n; ++t) {
    Real r2[L], du[L], alpha[L], beta[L];
    for (int l = 0; l < L; ++l) r2[l] = du[l] = Real(0);
    for (int k = 0; k < r; ++k) {
      const Real utk = s.ut[k];
#pragma omp simd
      for (int l = 0; l < L; ++l) {
        const Real bk = b[k * L + l];
        r2[l] += bk * bk;
        du[l] += utk * bk;
      }
    }
    // grad_b L = alpha b - beta ut with alpha = scale cos / ||b||^2, beta = scale / ||b||.
#pragma omp simd
    for (int l = 0; l < L; ++l) {
      const Real ir = Real(1) / sqrt_(r2[l]);
      beta[l] = s.scale * ir;
      alpha[l] = du[l] * ir * ir * beta[l];
    }
    for (int k = 0; k < r; ++k) {
      const Real s2k = s.sigma2[k], utk = s.ut[k];
#pragma omp simd
      for (int l = 0; l < L; ++l) {
        const Real step = lr[l] * s2k;
        b[k * L + l] = decay[l] * b[k * L + l] - step * (alpha[l] * b[k * L + l] - beta[l] * utk);
      }
    }
#pragma omp simd
    for (int l = 0; l < L; ++l) c[l] *= decay[l];
  }
}

}  // namespace pysharp
