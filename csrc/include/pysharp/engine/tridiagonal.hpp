// Eigen-decomposition of a small symmetric tridiagonal matrix by the implicit
// QL algorithm with Wilkinson-type shifts (the tql2 / tqli scheme).
#pragma once

#include "pysharp/core/config.hpp"

namespace pysharp {

// d (m): diagonal, overwritten with the eigenvalues (unsorted).
// e (m): e[i] couples i and i+1 for i < m-1; destroyed.
// Z (rows x m, row-major): overwritten with rows first_row .. first_row +
// rows - 1 of the eigenvector matrix, Z[r*m + c] is component first_row + r of
// eigenvector c (rows = -1: all m rows). Each row of that matrix evolves by
// the same rotations independently of the others, so a partial run gives the
// eigenvalues and those rows with exactly the bits of a full run, in O(m^2)
// instead of O(m^3): the last row is all a Lanczos convergence test needs, the
// first row all Gauss quadrature needs. Returns false if an eigenvalue fails
// to converge in 60 iterations (does not happen for finite input in practice).
template <class Real>
PYSHARP_HD bool tridiagonal_eigh(int m, Real* d, Real* e, Real* Z, int first_row = 0,
                                 int rows = -1) {
  if (rows < 0) rows = m;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < m; ++c) Z[r * m + c] = (first_row + r == c) ? Real(1) : Real(0);
  if (m == 0) return true;
  e[m - 1] = Real(0);
  const Real eps = sizeof(Real) == 8 ? Real(2.220446049250313e-16) : Real(1.1920929e-7);
  for (int l = 0; l < m; ++l) {
    int iter = 0;
    while (true) {
      int s = l;  // first index >= l where the matrix splits
      for (; s < m - 1; ++s) {
        const Real dd = fabs(d[s]) + fabs(d[s + 1]);
        if (fabs(e[s]) <= eps * dd) break;
      }
      if (s == l) break;
      if (++iter > 60) return false;
      Real g = (d[l + 1] - d[l]) / (Real(2) * e[l]);
      Real r = sqrt_(g * g + Real(1));
      g = d[s] - d[l] + e[l] / (g + (g >= Real(0) ? r : -r));
      Real sn = Real(1), cs = Real(1), p = Real(0);
      bool underflow = false;
      for (int i = s - 1; i >= l; --i) {
        const Real f = sn * e[i];
        const Real b = cs * e[i];
        r = sqrt_(f * f + g * g);
        e[i + 1] = r;
        if (r == Real(0)) {  // deflate and restart this eigenvalue
          d[i + 1] -= p;
          e[s] = Real(0);
          underflow = true;
          break;
        }
        sn = f / r;
        cs = g / r;
        g = d[i + 1] - p;
        r = (d[i] - g) * sn + Real(2) * cs * b;
        p = sn * r;
        d[i + 1] = g + p;
        g = cs * r - b;
        for (int k = 0; k < rows; ++k) {
          const Real t = Z[k * m + i + 1];
          Z[k * m + i + 1] = sn * Z[k * m + i] + cs * t;
          Z[k * m + i] = cs * Z[k * m + i] - sn * t;
        }
      }
      if (underflow) continue;
      d[l] -= p;
      e[l] = g;
      e[s] = Real(0);
    }
  }
  return true;
}

}  // namespace pysharp
