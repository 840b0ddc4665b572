// The trajectory engine's update rules. GENERATED from the method table METHODS in
// pysharp/_engine/methods.py by `python tools/gen_methods.py`: edit the table, not this file
// (CI runs the tool with --check). The update rules themselves are in trajectory.hpp.
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

enum class Method : int {
  gd_wd = 0,              // w+ = (1 - lr wd) w - lr grad L(w)
  pgd = 1,                // theta+ = Pi(theta - eta grad L(theta)), constant eta
  pgd_adaptive = 2,       // as pgd, eta follows the GD+WD recursion (Lemma 3.1) from eta_0 = eta
  scalar_rmsprop = 3,     // v+ = b v + (1-b) ||g||^2, w+ = (1 - lr wd) w - lr g / (sqrt(v+) + eps)
  pgd_quasi_rmsprop = 4,  // as pgd, eta follows a Quasi-RMSprop scheduler (trajectory.hpp)
};
inline constexpr int kMethodCount = 5;

// Names by value (host side: pysharp._core.METHODS).
inline constexpr const char* kMethodNames[kMethodCount] = {
    "gd_wd",
    "pgd",
    "pgd_adaptive",
    "scalar_rmsprop",
    "pgd_quasi_rmsprop",
};

// A batch's per-trajectory hyperparameters, each (B,) or null where the method does not
// read it (HYPERPARAMETERS in the table). Each method reads the fields its row names, never
// one borrowed for another meaning.
template <class Real>
struct Hyperparameters {
  const Real* lr = nullptr;  // GD+WD's learning rate (pgd_adaptive: the run it follows) (> 0)
  const Real* wd = nullptr;  // weight decay, lr wd < 1 (>= 0)
  const Real* eta = nullptr;  // effective LR on the sphere: pgd's, or the first (> 0)
  const Real* c = nullptr;  // Quasi-RMSprop's coefficient of ||g||^2 (> 0)

  // Field i, named kHyperparameterNames[i].
  PYSHARP_HD const Real*& field(int i) {
    switch (i) {
      case 0: return lr;
      case 1: return wd;
      case 2: return eta;
      default: return c;
    }
  }
  PYSHARP_HD const Real* field(int i) const {
    return const_cast<Hyperparameters*>(this)->field(i);  // read only
  }

  // The same fields from trajectory `first` on.
  PYSHARP_HD Hyperparameters from(long long first) const {
    Hyperparameters h = *this;
    for (int i = 0; i < 4; ++i)
      if (h.field(i)) h.field(i) += first;
    return h;
  }
};

// Field bits and names, in field order; kMethodHyper[m]: the fields method m reads.
enum HyperparameterBit : unsigned {
  kHyper_lr = 1u << 0,
  kHyper_wd = 1u << 1,
  kHyper_eta = 1u << 2,
  kHyper_c = 1u << 3,
};
inline constexpr int kHyperparameterCount = 4;
inline constexpr const char* kHyperparameterNames[kHyperparameterCount] = {
    "lr",
    "wd",
    "eta",
    "c",
};
inline constexpr unsigned kMethodHyper[kMethodCount] = {
    kHyper_lr | kHyper_wd,  // gd_wd
    kHyper_eta,  // pgd
    kHyper_eta | kHyper_lr | kHyper_wd,  // pgd_adaptive
    kHyper_lr | kHyper_wd,  // scalar_rmsprop
    kHyper_eta | kHyper_c,  // pgd_quasi_rmsprop
};

// Iterates stay on the unit sphere; the step size is eta, the effective LR.
PYSHARP_HD constexpr bool method_on_sphere(Method m) {
  return m == Method::pgd ||
         m == Method::pgd_adaptive ||
         m == Method::pgd_quasi_rmsprop;
}

// BN linear regression's exact reduced update exists for the method.
PYSHARP_HD constexpr bool method_has_reduced(Method m) {
  return m == Method::gd_wd ||
         m == Method::scalar_rmsprop;
}

}  // namespace pysharp
