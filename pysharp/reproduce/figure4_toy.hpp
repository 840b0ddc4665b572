// The 3-D example of Lyu, Li & Arora's Figure 4, built from the properties their Appendix F
// names (docs/tutorials/reproduce.rst, "Figure 4"): with alpha the angle of (x, y) from the
// diagonal, cos(alpha) = (x + y) / sqrt(2 (x^2 + y^2)),
//
//   L(w) = log(1 + a (1 - cos(alpha))),
//
// scale-invariant (it depends on w only through the direction of (x, y)). Its minimisers on the
// sphere are Gamma = {x = y > 0} (x = y < 0 is its maximum); on Gamma the spherical sharpness is
// a / (1 - z^2), least at z = 0. For a > 1 the period-two orbit at the edge attracts (the
// profile's quartic term is below the neutral -1/6 of Toy3D at z = 0), so GD+WD settles on it
// even at lr wd = 0.04. Undefined on the z axis (x = y = 0).
#include <pysharp/model.hpp>

template <class Real>
struct Figure4Toy {
  Real a;  // the loss's curvature across Gamma at z = 0 (> 0)
  static constexpr Real kSqrt2 = Real(1.4142135623730951);

  PYSHARP_HD int dim() const { return 3; }
  PYSHARP_HD int work_size() const { return 0; }

  template <class S>
  PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* /*work*/) const {
    const S rho2 = w[0] * w[0] + w[1] * w[1];
    const mask_t<S> defined = rho2 > Real(0);
    const S rho = sqrt_(rho2);
    const S e = w[1] - w[0];
    const S c = (w[0] + w[1]) / (kSqrt2 * rho);
    // 1 - cos(alpha) = sin^2(alpha) / (1 + cos(alpha)): no cancellation near Gamma, where the
    // run spends its time and the loss is ~1e-30 before the edge.
    const S u = select(c > Real(0), e * e / (Real(2) * rho2 * (Real(1) + c)), Real(1) - c);
    *loss = log1p_(a * u);
    // dc/dw = (-w1 e, w0 e, 0) / (sqrt(2) rho^3), dL/dw = -a / (1 + a u) dc/dw
    const S q = a / ((Real(1) + a * u) * kSqrt2 * rho * rho2);
    g[0] = -q * w[1] * e;
    g[1] = q * w[0] * e;
    g[2] = S(Real(0));
    return defined;
  }
};
PYSHARP_MODEL(Figure4Toy, PYSHARP_SCALAR(a))
