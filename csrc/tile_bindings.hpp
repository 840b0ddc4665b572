// What both tile bindings share, bind_tile.cpp (the CPU emulation) and cuda/bind_tile.cu
// (the device kernels): the (d, n) shapes a module compiles the BN linear regression tile
// for, as a type list, and the checks of a GD+WD run's arguments and of BN matrix
// completion's observations.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>
#include <tuple>

#include "module_options.hpp"
#include "pysharp/tile/bn_mc.hpp"

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

// The records of a GD+WD tile run, at steps 0, every, ... <= steps (a dimension of its
// record arrays); checked before any array is shaped by it.
inline pybind11::ssize_t tile_records(long long steps, long long every) {
  require(steps >= 0 && every >= 1, "steps must be >= 0 and record_every >= 1");
  return static_cast<pybind11::ssize_t>(steps / every + 1);
}

// v1 of a tile run that records top_grad, where given: (B, D), as W0. Reals: a NumPy
// array (pybind11).
template <class Reals>
void check_v1(const std::optional<Reals>& v1, long long B, long long D) {
  require(!v1 || (v1->ndim() == 2 && v1->shape(0) == B && v1->shape(1) == D),
          "v1 must be (B, D), as W0");
}

// BN matrix completion's observations as the tiles take them: rows, cols and u (N,),
// N >= 2, m1, m2, r >= 1, and every observation inside the (m1, m2) matrix (the kernels
// index the factors by them unchecked). Ints, Reals: NumPy arrays (pybind11).
template <class Ints, class Reals>
void check_bn_mc_observations(const Ints& rows, const Ints& cols, const Reals& u, int m1,
                              int m2, int r) {
  require(rows.ndim() == 1 && cols.ndim() == 1 && u.ndim() == 1 && rows.size() == u.size() &&
              cols.size() == u.size() && u.size() >= 2 && m1 >= 1 && m2 >= 1 && r >= 1,
          "rows, cols and u must be (N,), N >= 2, and m1, m2, r >= 1");
  require(tile::bn_mc_observations_inside(rows.data(), cols.data(), rows.size(), m1, m2),
          "an observation lies outside the (m1, m2) matrix");
}

}  // namespace pysharp::module
