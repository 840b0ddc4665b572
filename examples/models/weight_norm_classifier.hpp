// A weight-normalised two-layer classifier: w = (W (m x d), a (m)), row-major W first,
//   h_i = softplus(s (W / ||W||) x_i),  f_i = (a / ||a||) . h_i,
//   L(w) = (1/n) sum_i log(1 + exp(-y_i f_i)),  y_i = +-1.
// L is invariant to the scale of W and to the scale of a separately: two parameter groups
// of unequal sizes, w[0, m d) and w[m d, m d + m), declared by n_groups() and
// group_begin(k). Reference loss: weight_norm_classifier.py beside this file.
#include <pysharp/model.hpp>

template <class Real>
struct WeightNormClassifier {
  const Real* X;  // (n, d) inputs, row-major
  const Real* y;  // (n,) labels +-1
  int n, d, m;    // m: hidden units, set by the caller
  Real s;         // scale of the pre-activations

  PYSHARP_HD int dim() const { return m * d + m; }
  PYSHARP_HD int work_size() const { return 2 * m; }
  // Group 0 is W (m d values), group 1 is a (m values): offsets 0, m d, m d + m.
  PYSHARP_HD int n_groups() const { return 2; }
  PYSHARP_HD int group_begin(int k) const { return k == 0 ? 0 : k == 1 ? m * d : m * d + m; }

  // With U = W / ||W||, b = a / ||a||, z_i = s U x_i, sigma(t) = 1 / (1 + e^-t) and
  // r_i = -y_i sigma(-y_i f_i) / n: G_a = sum_i r_i h_i and
  // G_W = sum_i (r_i b * sigma(z_i)) s x_i^T; the gradients are their projections
  // orthogonal to each group, over its norm: g_a = (G_a - (G_a . b) b) / ||a||,
  // g_W = (G_W - <G_W, U> U) / ||W||.
  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    const int md = m * d;
    const S* a = w + md;
    S nW2 = Real(0), na2 = Real(0);
    for (int i = 0; i < md; ++i) nW2 += w[i] * w[i];
    for (int j = 0; j < m; ++j) na2 += a[j] * a[j];
    const mask_t<S> defined = (nW2 > Real(0)) & (na2 > Real(0));
    const S inv_W = Real(1) / sqrt_(nW2), inv_a = Real(1) / sqrt_(na2);
    for (int i = 0; i < md + m; ++i) g[i] = S(Real(0));
    S* z = work;      // z_i
    S* h = work + m;  // h_i
    S total = Real(0);
    for (int i = 0; i < n; ++i) {
      const Real* x = X + i * d;
      S f = Real(0);
      for (int j = 0; j < m; ++j) {
        S t = Real(0);
        for (int k = 0; k < d; ++k) t += w[j * d + k] * x[k];
        z[j] = s * inv_W * t;
        h[j] = log1p_(exp_(z[j]));  // softplus; |z| <= s ||x||
        f += a[j] * h[j];
      }
      const S margin = -y[i] * inv_a * f;
      total += log1p_(exp_(margin));
      const S r = -y[i] / (Real(1) + exp_(-margin)) / Real(n);
      for (int j = 0; j < m; ++j) {
        g[md + j] += r * h[j];
        // (r b_j sigma(z_j)) s / ||W||: the row's factor of G_W / ||W||
        const S c = r * a[j] * inv_a / (Real(1) + exp_(-z[j])) * s * inv_W;
        for (int k = 0; k < d; ++k) g[j * d + k] += c * x[k];
      }
    }
    *loss = total / Real(n);
    S dot_W = Real(0), dot_a = Real(0);  // <G_W / ||W||, W>, <G_a, a>
    for (int i = 0; i < md; ++i) dot_W += g[i] * w[i];
    for (int j = 0; j < m; ++j) dot_a += g[md + j] * a[j];
    for (int i = 0; i < md; ++i) g[i] -= dot_W * inv_W * inv_W * w[i];
    for (int j = 0; j < m; ++j) g[md + j] = inv_a * (g[md + j] - dot_a * inv_a * inv_a * a[j]);
    return defined;
  }
};
PYSHARP_MODEL(WeightNormClassifier, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n),
              PYSHARP_SCALAR(m), PYSHARP_SCALAR(s))
