// pysharp._core's _tile_* helpers: the fused tile algorithms of the GPU engine (csrc/include/pysharp/
// tile/) run on the CPU over the emulated warp (EmuWarp), so that their fragment
// layouts, padding, reductions, divergence freezing and placement are tested without
// a GPU. Not an API for speed: the emulation is slow on purpose (one lane at a time).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pysharp/tile/bn_linreg.hpp"
#include "pysharp/tile/bn_mc.hpp"
#include "pysharp/tile/bn_mc_warp.hpp"
#include "pysharp/tile/toy3d.hpp"
#include "tile_bindings.hpp"

namespace py = pybind11;

namespace pysharp::module {
namespace {

template <class T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;
using tile::EmuWarp;

// The (d, n) shapes the BN linear regression tile is compiled for here: the benchmark's
// two and one with both dimensions off the multiples of 8 (padding of d and of n).
using Shapes = std::tuple<Shape<40, 20>, Shape<100, 200>, Shape<13, 11>>;

// Calls f(Shape<d, n>{}) for the compiled shape equal to (d, n), or refuses.
template <class F>
void with_compiled_shape(int d, int n, F&& f) {
  require(with_shape<Shapes>(d, n, std::forward<F>(f)),
          "no tile compiled for d = " + std::to_string(d) + ", n = " + std::to_string(n) +
              " (see pysharp._core._TILE_BN_LINREG_SHAPES)");
}

// The model's data in tile layout (owned), as BNLinearRegressionCore computes ||Xc||_F^2.
struct PackedBNLinReg {
  std::vector<double> xc, u;
  tile::BNLinRegTileData data;
  int n, d;
  PackedBNLinReg(const carray<double>& Xc, const carray<double>& u_, double scale)
      : n(static_cast<int>(Xc.shape(0))), d(static_cast<int>(Xc.shape(1))) {
    require(Xc.ndim() == 2 && u_.ndim() == 1 && u_.shape(0) == Xc.shape(0),
            "Xc must be (n, d) and u (n,)");
    xc.resize(static_cast<std::size_t>(tile::round_up8(n)) * tile::round_up8(d));
    u.resize(tile::round_up8(n));
    tile::pack_bn_linreg(Xc.data(), u_.data(), n, d, xc.data(), u.data());
    double fro2 = 0;
    for (py::ssize_t k = 0; k < Xc.size(); ++k) fro2 += Xc.data()[k] * Xc.data()[k];
    const double err = double(d) * 2.220446049250313e-16;
    data = {xc.data(), u.data(), scale, err * err * fro2};
  }
};

// D = A B + C through the fragments of mma.m8n8k4 (tile/warp.hpp's layout).
carray<double> mma_m8n8k4(const carray<double>& A, const carray<double>& B,
                          const carray<double>& C) {
  require(A.ndim() == 2 && A.shape(0) == 8 && A.shape(1) == 4, "A must be (8, 4)");
  require(B.ndim() == 2 && B.shape(0) == 4 && B.shape(1) == 8, "B must be (4, 8)");
  require(C.ndim() == 2 && C.shape(0) == 8 && C.shape(1) == 8, "C must be (8, 8)");
  EmuWarp::reg<double> a, b, c0, c1;
  for (int l = 0; l < tile::kWarpLanes; ++l) {
    const int group = l >> 2, quad = l & 3;
    a[l] = A.at(group, quad);
    b[l] = B.at(quad, group);
    c0[l] = C.at(group, 2 * quad);
    c1[l] = C.at(group, 2 * quad + 1);
  }
  EmuWarp::mma(c0, c1, a, b);
  carray<double> out({8, 8});
  for (int l = 0; l < tile::kWarpLanes; ++l) {
    const int group = l >> 2, quad = l & 3;
    out.mutable_at(group, 2 * quad) = c0[l];
    out.mutable_at(group, 2 * quad + 1) = c1[l];
  }
  return out;
}

// The tile's loss and gradient at the rows of W (B, d), eight rows per tile in order.
py::tuple bn_linreg_loss_grad(const carray<double>& Xc, const carray<double>& u, double scale,
                              const carray<double>& W) {
  const PackedBNLinReg p(Xc, u, scale);
  require(W.ndim() == 2 && W.shape(1) == p.d, "W must be (B, d)");
  const py::ssize_t Bn = W.shape(0);
  carray<double> loss(Bn), G({Bn, static_cast<py::ssize_t>(p.d)});
  carray<std::uint8_t> ok(Bn);
  with_compiled_shape(p.d, p.n, [&](auto s) {
    using Tile = tile::BNLinRegTile<EmuWarp, decltype(s)::d, decltype(s)::n>;
    const Tile t{p.data};
    for (py::ssize_t b0 = 0; b0 < Bn; b0 += 8) {
      typename Tile::R w[Tile::DB][2];
      for (int b = 0; b < Tile::DB; ++b)
        for (int i = 0; i < 2; ++i)
          for (int l = 0; l < tile::kWarpLanes; ++l) {
            const py::ssize_t row = b0 + (l >> 2);
            const int coord = 8 * b + 2 * (l & 3) + i;
            w[b][i][l] = row < Bn && coord < p.d ? W.at(row, coord) : 0.0;
          }
      typename Tile::Eval e;
      std::vector<double> park(Tile::kParkDoubles);
      t.evaluate(w, e, park.data());
      for (int l = 0; l < tile::kWarpLanes; ++l) {
        const py::ssize_t row = b0 + (l >> 2);
        if (row >= Bn) continue;
        if ((l & 3) == 0) {
          loss.mutable_at(row) = e.loss[l];
          ok.mutable_at(row) = e.ok[l];
        }
        for (int b = 0; b < Tile::DB; ++b)
          for (int i = 0; i < 2; ++i) {
            const int coord = 8 * b + 2 * (l & 3) + i;
            if (coord < p.d) G.mutable_at(row, coord) = e.g[b][i][l];
          }
      }
    }
  });
  return py::make_tuple(loss, G, ok);
}

// The outputs of a GD+WD run and the IO block that points at them.
// With v1 (B, D), top_grad is (R, B); without, (0, B).
struct RunOutputs {
  carray<double> w_final, loss, norm2, eff_lr, grad_norm, top_grad;
  carray<std::uint8_t> diverged;
  carray<long long> diverged_step;
  std::optional<carray<double>> v1;
  tile::GdWdTileIO io;

  RunOutputs(const carray<double>& W0, const carray<double>& lr, const carray<double>& wd,
             long long steps, long long every, std::optional<carray<double>> v1_)
      : w_final({W0.shape(0), W0.shape(1)}),
        loss({tile_records(steps, every), W0.shape(0)}),
        norm2({tile_records(steps, every), W0.shape(0)}),
        eff_lr({tile_records(steps, every), W0.shape(0)}),
        grad_norm({tile_records(steps, every), W0.shape(0)}),
        top_grad({v1_ ? tile_records(steps, every) : 0, W0.shape(0)}),
        diverged(W0.shape(0)), diverged_step(W0.shape(0)), v1(std::move(v1_)) {
    const py::ssize_t Bn = W0.shape(0);
    require(W0.ndim() == 2 && lr.ndim() == 1 && wd.ndim() == 1 && lr.shape(0) == Bn &&
                wd.shape(0) == Bn,
            "W0 must be (B, D), lr and wd (B,)");
    check_v1(v1, Bn, W0.shape(1));
    io = {W0.data(),           lr.data(),           wd.data(),
          w_final.mutable_data(), loss.mutable_data(), norm2.mutable_data(),
          eff_lr.mutable_data(),  grad_norm.mutable_data(),
          diverged.mutable_data(), diverged_step.mutable_data(), Bn, steps, every,
          v1 ? v1->data() : nullptr, v1 ? top_grad.mutable_data() : nullptr};
  }
  py::tuple result() const {
    return py::make_tuple(w_final, loss, norm2, diverged, diverged_step, eff_lr, grad_norm,
                          top_grad);
  }
};

// GD+WD from the rows of W0 over the emulated warp. placement (length a multiple of 8):
// slot s of the launch (tile s / 8, row s % 8) runs trajectory placement[s], -1 for a
// padding row; every trajectory exactly once. Default: 0 .. B-1 in order, padded.
py::tuple bn_linreg_gd_wd(const carray<double>& Xc, const carray<double>& u, double scale,
                          const carray<double>& W0, const carray<double>& lr,
                          const carray<double>& wd, long long steps, long long record_every,
                          std::optional<carray<long long>> placement,
                          std::optional<carray<double>> v1) {
  const PackedBNLinReg p(Xc, u, scale);
  require(W0.ndim() == 2 && W0.shape(1) == p.d, "W0 must be (B, d)");
  RunOutputs out(W0, lr, wd, steps, record_every, std::move(v1));
  const long long Bn = W0.shape(0);
  std::vector<long long> slots;
  if (placement) {
    require(placement->ndim() == 1 && placement->size() % 8 == 0,
            "placement must be 1-D, its length a multiple of 8");
    slots.assign(placement->data(), placement->data() + placement->size());
  } else {
    for (long long b = 0; b < (Bn + 7) / 8 * 8; ++b) slots.push_back(b < Bn ? b : -1);
  }
  std::vector<int> seen(Bn, 0);
  for (long long s : slots) {
    require(s >= -1 && s < Bn, "placement holds an index out of range");
    if (s >= 0) ++seen[s];
  }
  for (long long b = 0; b < Bn; ++b)
    require(seen[b] == 1, "placement must hold every trajectory once");
  with_compiled_shape(p.d, p.n, [&](auto s) {
    using Tile = tile::BNLinRegTile<EmuWarp, decltype(s)::d, decltype(s)::n>;
    const Tile t{p.data};
    std::vector<double> park(Tile::kParkDoubles);
    for (std::size_t first = 0; first < slots.size(); first += 8) {
      EmuWarp::reg<long long> traj;
      for (int l = 0; l < tile::kWarpLanes; ++l) traj[l] = slots[first + (l >> 2)];
      t.run(traj, out.io, park.data());
    }
  });
  return out.result();
}

// GD+WD on Toy3D(c), one (emulated) thread per trajectory.
py::tuple toy3d_gd_wd(double c, const carray<double>& W0, const carray<double>& lr,
                      const carray<double>& wd, long long steps, long long record_every,
                      std::optional<carray<double>> v1) {
  require(W0.ndim() == 2 && W0.shape(1) == 3, "W0 must be (B, 3)");
  RunOutputs out(W0, lr, wd, steps, record_every, std::move(v1));
  const Toy3D<double> m{c};
  for (long long b = 0; b < W0.shape(0); ++b) tile::toy3d_gd_wd_thread(m, b, out.io);
  return out.result();
}

// What the emulated shared memory holds before a kernel writes it.
constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();

// The shared memory of a block the emulation stands for: an H100's or H200's (227 KB).
constexpr long long kEmulatedBlockSmem = 232448;

// A BN matrix completion from the binding's arguments, checked: rows, cols, u are the N
// observations (model.rows, model.cols, model._u), W0 (B, (m1 + m2) r).
BNMatrixCompletion<double> bn_mc_model(const carray<int>& rows, const carray<int>& cols,
                                       const carray<double>& u, double scale, int m1, int m2,
                                       int r, const carray<double>& W0) {
  check_bn_mc_observations(rows, cols, u, m1, m2, r);
  const BNMatrixCompletion<double> m{rows.data(), cols.data(), u.data(), scale,
                                     static_cast<int>(u.size()), m1, m2, r};
  require(W0.ndim() == 2 && W0.shape(1) == m.dim(), "W0 must be (B, (m1 + m2) r)");
  return m;
}

// GD+WD on BN matrix completion, one (emulated) thread per trajectory, its scratch as on
// the device.
py::tuple bn_mc_gd_wd(const carray<int>& rows, const carray<int>& cols, const carray<double>& u,
                      double scale, int m1, int m2, int r, const carray<double>& W0,
                      const carray<double>& lr, const carray<double>& wd, long long steps,
                      long long record_every, std::optional<carray<double>> v1) {
  const BNMatrixCompletion<double> m = bn_mc_model(rows, cols, u, scale, m1, m2, r, W0);
  require(tile::bn_mc_tile_fits(m.dim(), m.N, kEmulatedBlockSmem),
          "the model is too large for the BN matrix completion tile (2 D + N > " +
              std::to_string(tile::kBnMcMaxThreadDoubles - 1) + ")");
  RunOutputs out(W0, lr, wd, steps, record_every, std::move(v1));
  // NaN, not 0, where the kernel finds uninitialised shared memory: a slot read before it
  // is written shows in the results here too.
  std::vector<double> scratch(tile::bn_mc_thread_doubles(m), kUnset);
  for (long long b = 0; b < W0.shape(0); ++b)
    tile::bn_mc_gd_wd_thread(m, b, out.io, scratch.data());
  return out.result();
}

// GD+WD on BN matrix completion, one (emulated) warp per trajectory, its scratch as on the
// device.
py::tuple bn_mc_warp_gd_wd(const carray<int>& rows, const carray<int>& cols,
                           const carray<double>& u, double scale, int m1, int m2, int r,
                           const carray<double>& W0, const carray<double>& lr,
                           const carray<double>& wd, long long steps, long long record_every,
                           std::optional<carray<double>> v1) {
  const BNMatrixCompletion<double> m = bn_mc_model(rows, cols, u, scale, m1, m2, r, W0);
  require(tile::bn_mc_warp_tile_fits(m.dim(), m.N, kEmulatedBlockSmem),
          "the model is too large for the BN matrix completion warp tile (2 D + N + 1 doubles "
          "over a block's shared memory)");
  RunOutputs out(W0, lr, wd, steps, record_every, std::move(v1));
  const tile::BNMcWarpTerms terms(m);
  const tile::BNMcWarpTile<EmuWarp> t{
      {m, terms.pass_start.data(), terms.obs.data(), terms.other.data()}};
  std::vector<double> scratch(tile::bn_mc_warp_doubles(m.dim(), m.N), kUnset);
  for (long long b = 0; b < W0.shape(0); ++b) t.run(b, out.io, scratch.data());
  return out.result();
}

// The warp tile's gradient terms: (pass_start, obs, other) of tile::BNMcWarpTerms.
py::tuple bn_mc_warp_terms(const carray<int>& rows, const carray<int>& cols, int m1, int m2,
                           int r) {
  require(rows.ndim() == 1 && cols.ndim() == 1 && rows.size() == cols.size() && m1 >= 1 &&
              m2 >= 1 && r >= 1,
          "rows and cols must be (N,), and m1, m2, r >= 1");
  require(tile::bn_mc_observations_inside(rows.data(), cols.data(), rows.size(), m1, m2),
          "an observation lies outside the (m1, m2) matrix");
  const tile::BNMcWarpTerms t(BNMatrixCompletion<double>{
      rows.data(), cols.data(), nullptr, 0.0, static_cast<int>(rows.size()), m1, m2, r});
  auto out = [](const std::vector<int>& v) { return carray<int>(v.size(), v.data()); };
  return py::make_tuple(out(t.pass_start), out(t.obs), out(t.other));
}

}  // namespace

// Test helpers of the module, named _tile_* (a submodule would turn the one-file type
// stub, pysharp/_core.pyi, into a package).
void bind_tile(py::module_& m) {
  m.attr("_TILE_BN_LINREG_SHAPES") = shape_list<Shapes>();
  m.def("_tile_bn_linreg_fits", &has_shape<Shapes>, py::arg("d"), py::arg("n"),
        "Whether BN linear regression with d coordinates and n samples runs on the tile: "
        "here, whether the emulation is compiled for (d, n).");
  m.def("_tile_mma_m8n8k4", &mma_m8n8k4, py::arg("A"), py::arg("B"), py::arg("C"),
        "A @ B + C through the fragments of mma.m8n8k4 f64 on the emulated warp.");
  m.def("_tile_bn_linreg_loss_grad", &bn_linreg_loss_grad, py::arg("Xc"), py::arg("u"),
        py::arg("scale"), py::arg("W"),
        "(loss (B,), grad (B, d), ok (B,)) of BN linear regression from the tile's step.");
  m.def("_tile_bn_linreg_gd_wd", &bn_linreg_gd_wd, py::arg("Xc"), py::arg("u"),
        py::arg("scale"), py::arg("W0"), py::arg("lr"), py::arg("wd"), py::arg("steps"),
        py::arg("record_every"), py::arg("placement") = py::none(), py::arg("v1") = py::none(),
        "GD+WD on BN linear regression, 8 trajectories per tile: (w_final (B, d), "
        "loss (R, B), norm2 (R, B), diverged (B,), diverged_step (B,), eff_lr (R, B), "
        "grad_norm (R, B), top_grad (R, B): ||w|| v1 . grad L(w), given unit vectors v1 "
        "(B, d); (0, B) without).");
  m.def(
      "_tile_bn_mc_fits",
      [](int D, int N) { return tile::bn_mc_tile_fits(D, N, kEmulatedBlockSmem); },
      py::arg("D"), py::arg("N"),
      "Whether BN matrix completion with D coordinates and N observations runs on the tile "
      "(an H100's or H200's shared memory per block).");
  m.def("_tile_bn_mc_gd_wd", &bn_mc_gd_wd, py::arg("rows"), py::arg("cols"), py::arg("u"),
        py::arg("scale"), py::arg("m1"), py::arg("m2"), py::arg("r"), py::arg("W0"),
        py::arg("lr"), py::arg("wd"), py::arg("steps"), py::arg("record_every"),
        py::arg("v1") = py::none(),
        "GD+WD on BN matrix completion, one thread per trajectory: the same tuple as "
        "_tile_bn_linreg_gd_wd.");
  m.def(
      "_tile_bn_mc_warp_fits",
      [](int D, int N) { return tile::bn_mc_warp_tile_fits(D, N, kEmulatedBlockSmem); },
      py::arg("D"), py::arg("N"),
      "Whether BN matrix completion with D coordinates and N observations runs on the warp "
      "tile (an H100's or H200's shared memory per block).");
  m.def("_tile_bn_mc_warp_gd_wd", &bn_mc_warp_gd_wd, py::arg("rows"), py::arg("cols"),
        py::arg("u"), py::arg("scale"), py::arg("m1"), py::arg("m2"), py::arg("r"),
        py::arg("W0"), py::arg("lr"), py::arg("wd"), py::arg("steps"), py::arg("record_every"),
        py::arg("v1") = py::none(),
        "GD+WD on BN matrix completion, one warp per trajectory: the same tuple as "
        "_tile_bn_linreg_gd_wd.");
  m.def("_tile_bn_mc_warp_terms", &bn_mc_warp_terms, py::arg("rows"), py::arg("cols"),
        py::arg("m1"), py::arg("m2"), py::arg("r"),
        "(pass_start (ceil(D / 32) + 1,), obs (T,), other (T,)): the gradient terms of BN "
        "matrix completion's warp tile, lane l of pass p reading pass_start[p] + 32 j + l.");
  m.def("_tile_toy3d_gd_wd", &toy3d_gd_wd, py::arg("c"), py::arg("W0"), py::arg("lr"),
        py::arg("wd"), py::arg("steps"), py::arg("record_every"), py::arg("v1") = py::none(),
        "GD+WD on Toy3D, one thread per trajectory: the same tuple as _tile_bn_linreg_gd_wd.");
}

}  // namespace pysharp::module
