// Higher derivatives of any model, from its one templated loss_grad.
//
// A model is any type with dim(), work_size() and
//     template <class S> mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const;
// written once for plain scalars, jets and lane blocks (core/lanes.hpp) alike;
// Real here may be a lane block, so one call serves W points. Evaluating it on the jet
// w + e v gives the HVP (order 1) and the third-order contraction (order 2).
#pragma once

#include "pysharp/core/jet.hpp"

namespace pysharp {

// Scratch, in jets of order N, that one derivative evaluation needs:
// the seeded point, its gradient and the model's work.
template <class Model>
PYSHARP_HD int jet_scratch_size(const Model& m) {
  return 2 * m.dim() + m.work_size();
}

// Evaluates grad L on the order-N jet w + e v; on success the gradient's
// Taylor coefficients sit in scratch[D .. 2D).
template <int N, class Model, class Real>
PYSHARP_HD mask_t<Real> seeded_gradient(const Model& m, const Real* w, const Real* v,
                                Jet<Real, N>* scratch) {
  const int D = m.dim();
  Jet<Real, N>* wj = scratch;
  for (int i = 0; i < D; ++i) {
    wj[i] = Jet<Real, N>(w[i]);
    wj[i].c[1] = v[i];
  }
  Jet<Real, N> loss;
  return m.loss_grad(wj, &loss, wj + D, wj + 2 * D);
}

// out = H(w) v. scratch: jet_scratch_size(m) jets of order 1.
template <class Model, class Real>
PYSHARP_HD mask_t<Real> hvp(const Model& m, const Real* w, const Real* v, Real* out,
                           Jet<Real, 1>* scratch) {
  const mask_t<Real> defined = seeded_gradient<1>(m, w, v, scratch);
  const Jet<Real, 1>* g = scratch + m.dim();
  for (int i = 0; i < m.dim(); ++i) out[i] = g[i].c[1];
  return defined;
}

// out = D^3L(w)[v, v], the derivative of H(w + t v) v at t = 0.
// scratch: jet_scratch_size(m) jets of order 2.
template <class Model, class Real>
PYSHARP_HD mask_t<Real> third_contraction(const Model& m, const Real* w, const Real* v,
                                         Real* out, Jet<Real, 2>* scratch) {
  const mask_t<Real> defined = seeded_gradient<2>(m, w, v, scratch);
  const Jet<Real, 2>* g = scratch + m.dim();
  for (int i = 0; i < m.dim(); ++i) out[i] = Real(2) * g[i].c[2];
  return defined;
}

}  // namespace pysharp
