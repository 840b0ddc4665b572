// The trajectory engine's update rules. GENERATED from the method table METHODS in
// pysharp/_engine/methods.py by `python tools/gen_methods.py`: edit the table, not this file
// (CI runs the tool with --check). The update rules themselves are in trajectory.hpp.
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

enum class Method : int {
  gd_wd = 0,              // w+ = (1 - lr wd) w - lr grad L(w)
  pgd = 1,                // theta+ = Pi(theta - eta grad L(theta)), constant eta = lr
  pgd_adaptive = 2,       // as pgd, eta follows the GD+WD recursion (Lemma 3.1) from lr
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

// Iterates stay on the unit sphere; lr is the effective LR.
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
