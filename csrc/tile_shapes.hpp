// The (d, n) shapes a module compiles the BN linear regression tile for (its template
// arguments), as a type list that both tile bindings read: bind_tile.cpp (the CPU
// emulation) and cuda/bind_tile.cu (the device kernels).
#pragma once

#include <pybind11/pybind11.h>

#include <tuple>

namespace pysharp::module {

template <int D, int N>
struct Shape {
  static constexpr int d = D, n = N;
};

// Calls f(Shape<d, n>{}) for the shape of the list Shapes (a std::tuple of Shape) equal to
// (d, n); false if there is none.
template <class Shapes, class F>
bool with_shape(int d, int n, F&& f) {
  return std::apply(
      [&](auto... s) { return ((s.d == d && s.n == n && (f(s), true)) || ...); }, Shapes{});
}

template <class Shapes>
bool has_shape(int d, int n) {
  return with_shape<Shapes>(d, n, [](auto) {});
}

// [(d, n), ...]: the module's _TILE_BN_LINREG_SHAPES.
template <class Shapes>
pybind11::list shape_list() {
  pybind11::list out;
  std::apply([&](auto... s) { (out.append(pybind11::make_tuple(s.d, s.n)), ...); }, Shapes{});
  return out;
}

}  // namespace pysharp::module
