// The loss_grad of every square-loss model (models/square_loss.hpp): the
// full-batch L = (1/2n) sum_i r_i^2 and its gradient, summed from the model's
// per-sample sample(w, x_i, y_i, 1/n, g, work) in sample order.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/core/config.hpp"

namespace pysharp {

template <class M, class S>
PYSHARP_HD mask_t<S> square_loss_grad(const M& m, const S* w, S* loss, S* g, S* work) {
  using Real = std::remove_const_t<std::remove_pointer_t<decltype(M::X)>>;  // the model's
  for (int k = 0; k < m.dim(); ++k) g[k] = S(0);
  S acc = S(0);
  const Real inv_n = Real(1) / Real(m.n_samples());
  for (int i = 0; i < m.n_samples(); ++i) {
    const S r = m.sample(w, m.X + static_cast<long long>(i) * m.input_dim(), m.y[i], inv_n, g,
                         work);
    acc += r * r;
  }
  *loss = acc * (Real(0.5) * inv_n);
  return mask_t<S>(true);
}

}  // namespace pysharp
