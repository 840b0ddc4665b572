// A diagonal linear network on the square loss, the implicit-bias workhorse of SGD:
// f(x; u, v) = sum_k (u_k^2 - v_k^2) x_k,   L = (1/2n) sum_i (f(x_i) - y_i)^2,
// with w = (u, v), D = 2d. Not scale-invariant: a square-loss model, so SGD and the
// linear-stability tools take it (pysharp.run_sgd, pysharp.stability). Its data are
// the fields the square-loss tools read, X (n, d) and y (n,). Reference loss:
// diagonal_net.py beside this file.
#include <pysharp/model.hpp>

template <class Real>
struct DiagonalNet {
  const Real* X;  // (n, d) inputs, row-major
  const Real* y;  // (n,) targets
  int n, d;

  PYSHARP_HD int dim() const { return 2 * d; }
  PYSHARP_HD int input_dim() const { return d; }
  PYSHARP_HD int n_samples() const { return n; }
  PYSHARP_HD int work_size() const { return 0; }

  // One sample: r = f(x) - yi; adds coeff r grad_w f into g and returns r.
  // x, yi, coeff are Real, or lane blocks (the SGD engine's per-lane batches).
  template <class S, class X>
  PYSHARP_HD S sample(const S* w, const X* x, X yi, X coeff, S* g, S* /*work*/) const {
    const S* u = w;
    const S* v = w + d;
    S f = S(0);
    for (int k = 0; k < d; ++k) f += (u[k] * u[k] - v[k] * v[k]) * x[k];
    const S r = f - yi;
    const S c = Real(2) * r * coeff;
    for (int k = 0; k < d; ++k) {
      g[k] += c * u[k] * x[k];      // df/du_k = 2 u_k x_k
      g[d + k] -= c * v[k] * x[k];  // df/dv_k = -2 v_k x_k
    }
    return r;
  }

  // f(x), a = grad_w f (2d) and gx = grad_x f (d) at one input.
  PYSHARP_HD void jacobian(const Real* w, const Real* x, Real* f, Real* a, Real* gx,
                           Real* /*work*/) const {
    *f = Real(0);
    for (int k = 0; k < d; ++k) {
      gx[k] = w[k] * w[k] - w[d + k] * w[d + k];
      *f += gx[k] * x[k];
      a[k] = Real(2) * w[k] * x[k];
      a[d + k] = -Real(2) * w[d + k] * x[k];
    }
  }

  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    return square_loss_grad(*this, w, loss, g, work);
  }
};
PYSHARP_MODEL(DiagonalNet, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n))
