// Higher derivatives of any model, from its one templated loss_grad.
//
// A model is any type with dim(), work_size() and
//     template <class S> mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const;
// written once for plain scalars, jets and lane blocks (core/lanes.hpp) alike;
// Real here may be a lane block, so one call serves W points. Evaluating it on the jet
// w + e v gives the HVP (order 1) and the third-order contraction (order 2).
//
// Those read only the gradient's top Taylor coefficient. A model whose
// gradient ends in a fixed linear map (grad = X^T r, core/dense.hpp's
// matvec_cols) may take g of another type than S,
//     template <class S, class G> mask_t<S> loss_grad(const S* w, S* loss, G* g, S* work) const;
// and, given g of the jets' coefficient type, write only that coefficient:
// the lower ones of the map are never computed (BN linear regression's HVP
// then costs three matvecs of Xc instead of four). Same source, same
// arithmetic for the coefficient kept.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/core/jet.hpp"

namespace pysharp {

// Scratch, in jets of order N, that one derivative evaluation needs:
// the seeded point, its gradient and the model's work.
template <class Model>
PYSHARP_HD int jet_scratch_size(const Model& m) {
  return 2 * m.dim() + m.work_size();
}

// Whether Model's loss_grad accepts jets J with a gradient of coefficient type R.
template <class Model, class J, class R, class = void>
struct writes_top_coefficient : std::false_type {};
template <class Model, class J, class R>
struct writes_top_coefficient<
    Model, J, R,
    std::void_t<decltype(std::declval<const Model&>().loss_grad(
        std::declval<const J*>(), std::declval<J*>(), std::declval<R*>(),
        std::declval<J*>()))>> : std::true_type {};

// Evaluates grad L on the order-N jet w + e v and writes the top Taylor
// coefficient of the gradient into out (D values); out may alias v.
template <int N, class Model, class Real>
PYSHARP_HD mask_t<Real> seeded_top_coefficient(const Model& m, const Real* w, const Real* v,
                                               Real* out, Jet<Real, N>* scratch) {
  const int D = m.dim();
  Jet<Real, N>* wj = scratch;
  for (int i = 0; i < D; ++i) {
    wj[i] = Jet<Real, N>(w[i]);
    wj[i].c[1] = v[i];
  }
  Jet<Real, N> loss;
  Jet<Real, N>* work = scratch + 2 * D;
  if constexpr (writes_top_coefficient<Model, Jet<Real, N>, Real>::value) {
    return m.loss_grad(wj, &loss, out, work);
  } else {
    Jet<Real, N>* g = scratch + D;
    const mask_t<Real> defined = m.loss_grad(wj, &loss, g, work);
    for (int i = 0; i < D; ++i) out[i] = g[i].c[N];
    return defined;
  }
}

// out = H(w) v. scratch: jet_scratch_size(m) jets of order 1.
template <class Model, class Real>
PYSHARP_HD mask_t<Real> hvp(const Model& m, const Real* w, const Real* v, Real* out,
                           Jet<Real, 1>* scratch) {
  return seeded_top_coefficient<1>(m, w, v, out, scratch);
}

// out = D^3L(w)[v, v], the derivative of H(w + t v) v at t = 0.
// scratch: jet_scratch_size(m) jets of order 2.
template <class Model, class Real>
PYSHARP_HD mask_t<Real> third_contraction(const Model& m, const Real* w, const Real* v,
                                         Real* out, Jet<Real, 2>* scratch) {
  const mask_t<Real> defined = seeded_top_coefficient<2>(m, w, v, out, scratch);
  for (int i = 0; i < m.dim(); ++i) out[i] = Real(2) * out[i];
  return defined;
}

}  // namespace pysharp
