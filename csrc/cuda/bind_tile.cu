// pysharp._cuda's _tile_* functions: the fused tile kernels (cuda/tile_kernels.cuh)
// launched on host arrays, with the signatures of pysharp._core's _tile_* helpers (the
// same algorithms on an emulated warp), so that a device run compares with the CPU
// emulation call for call. backend="cuda" runs GD+WD on them where they apply
// (pysharp/_backends/_tiles.py). Trajectory b runs in row b % 8 of tile b / 8.
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/executor.cuh"
#include "cuda/tile_kernels.cuh"
#include "tile_bindings.hpp"

namespace pysharp::cuda_module {
namespace {

using module::tile_records;

// The host outputs of a GD+WD tile run and their device mirrors.
// With v1 (B, D), top_grad is (R, B); without, (0, B).
struct TileRun {
  py::ssize_t B;  // B and D: array dimensions, of tile_records' type
  long long steps, every;
  py::ssize_t D;
  carray<double> w_final, loss, norm2, eff_lr, grad_norm, top_grad;
  carray<std::uint8_t> diverged;
  carray<long long> diverged_step;
  DeviceBuffer<double> w0, lr, wd, w_final_d, loss_d, norm2_d, eff_lr_d, grad_norm_d, v1_d,
      top_grad_d;
  DeviceBuffer<std::uint8_t> diverged_d;
  DeviceBuffer<long long> step_d;

  TileRun(const carray<double>& W0, const carray<double>& lr_, const carray<double>& wd_,
          long long steps_, long long every_, const std::optional<carray<double>>& v1)
      : B(W0.ndim() == 2 ? W0.shape(0) : 0), steps(steps_), every(every_),
        D(W0.ndim() == 2 ? W0.shape(1) : 0),
        w_final({B, D}), loss({tile_records(steps_, every_), B}),
        norm2({tile_records(steps_, every_), B}), eff_lr({tile_records(steps_, every_), B}),
        grad_norm({tile_records(steps_, every_), B}),
        top_grad({v1 ? tile_records(steps_, every_) : 0, B}), diverged(B), diverged_step(B),
        w0(DeviceBuffer<double>::from(W0)), lr(DeviceBuffer<double>::from(lr_)),
        wd(DeviceBuffer<double>::from(wd_)), w_final_d(B * D), loss_d(loss.size()),
        norm2_d(norm2.size()), eff_lr_d(eff_lr.size()), grad_norm_d(grad_norm.size()),
        v1_d(checked_v1(v1, B, D)), top_grad_d(top_grad.size()), diverged_d(B), step_d(B) {
    require(W0.ndim() == 2 && lr_.ndim() == 1 && wd_.ndim() == 1 && lr_.shape(0) == B &&
                wd_.shape(0) == B && B >= 1,
            "W0 must be (B, D), lr and wd (B,), B >= 1");
  }
  static DeviceBuffer<double> checked_v1(const std::optional<carray<double>>& v1, long long B,
                                         long long D) {
    module::check_v1(v1, B, D);
    return v1 ? DeviceBuffer<double>::from(*v1) : DeviceBuffer<double>();
  }
  tile::GdWdTileIO io() const {
    return {w0.get(),         lr.get(),      wd.get(),         w_final_d.get(),
            loss_d.get(),     norm2_d.get(), eff_lr_d.get(),   grad_norm_d.get(),
            diverged_d.get(), step_d.get(),  B,                steps,
            every,            v1_d.get(),    v1_d.get() ? top_grad_d.get() : nullptr};
  }
  py::tuple result() {
    w_final_d.to(w_final.mutable_data());
    loss_d.to(loss.mutable_data());
    norm2_d.to(norm2.mutable_data());
    eff_lr_d.to(eff_lr.mutable_data());
    grad_norm_d.to(grad_norm.mutable_data());
    diverged_d.to(diverged.mutable_data());
    step_d.to(diverged_step.mutable_data());
    top_grad_d.to(top_grad.mutable_data());  // nothing without v1
    return py::make_tuple(w_final, loss, norm2, diverged, diverged_step, eff_lr, grad_norm,
                          top_grad);
  }
};

// Blocks of a persistent launch: as many as fit on the device at once, no more than
// there is work for.
template <class Kernel>
int persistent_blocks(Kernel kernel, int smem, long long work_blocks,
                      int threads = cuda::kTileThreads) {
  int dev = 0, sms = 0, per_sm = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
        "occupancy");
  require(per_sm >= 1, "the tile kernel does not fit on this device (shared memory)");
  const long long most = static_cast<long long>(sms) * per_sm;
  return static_cast<int>(work_blocks < most ? work_blocks : most);
}

// The shared memory one block of the current device may opt in to (bytes).
int block_smem_optin() {
  int dev = 0, optin = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "shared memory per block");
  return optin;
}

// The (d, n) shapes the BN linear regression tile kernel is compiled for: the benchmark's.
using Shapes = std::tuple<module::Shape<40, 20>, module::Shape<100, 200>>;

// Whether the current device has FP64 mma (compute capability 8.0+), which the BN linear
// regression tile kernel is built on.
bool has_fp64_mma() {
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "capability");
  return major >= 8;
}

template <int D, int N>
void launch_bn_linreg(const carray<double>& Xc, const carray<double>& u, double scale,
                      TileRun& run) {
  const int NP = tile::round_up8(N), DP = tile::round_up8(D);
  std::vector<double> xc_pad(static_cast<std::size_t>(NP) * DP), u_pad(NP);
  tile::pack_bn_linreg(Xc.data(), u.data(), N, D, xc_pad.data(), u_pad.data());
  double fro2 = 0;
  for (py::ssize_t k = 0; k < Xc.size(); ++k) fro2 += Xc.data()[k] * Xc.data()[k];
  const double err = double(D) * 2.220446049250313e-16;
  DeviceBuffer<double> xc_d(xc_pad.data(), xc_pad.size()), u_d(u_pad.data(), u_pad.size());
  const tile::BNLinRegTileData data{xc_d.get(), u_d.get(), scale, err * err * fro2};
  auto kernel = cuda::bn_linreg_gd_wd_tile_kernel<D, N>;
  constexpr int smem = cuda::bn_linreg_tile_smem_bytes<D, N>();
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "shared memory of the tile kernel");
  require(has_fp64_mma(),
          "the BN linear regression tile kernel needs FP64 mma (compute capability 8.0+)");
  const long long tiles = (run.B + 7) / 8;
  const int blocks = persistent_blocks(kernel, smem, (tiles + cuda::kTileWarps - 1) /
                                                         cuda::kTileWarps);
  kernel<<<blocks, cuda::kTileThreads, smem>>>(data, run.io());
  finish_launch("bn_linreg_gd_wd_tile_kernel");
}

py::tuple bn_linreg_gd_wd(const carray<double>& Xc, const carray<double>& u, double scale,
                          const carray<double>& W0, const carray<double>& lr,
                          const carray<double>& wd, long long steps, long long record_every,
                          const std::optional<carray<double>>& v1) {
  require(Xc.ndim() == 2 && u.ndim() == 1 && u.shape(0) == Xc.shape(0),
          "Xc must be (n, d) and u (n,)");
  const int n = static_cast<int>(Xc.shape(0)), d = static_cast<int>(Xc.shape(1));
  require(W0.ndim() == 2 && W0.shape(1) == d, "W0 must be (B, d)");
  require(module::has_shape<Shapes>(d, n),
          "no tile kernel for d = " + std::to_string(d) + ", n = " + std::to_string(n) +
              " (see pysharp._cuda._TILE_BN_LINREG_SHAPES)");
  TileRun run(W0, lr, wd, steps, record_every, v1);
  module::with_shape<Shapes>(d, n, [&](auto s) {
    launch_bn_linreg<decltype(s)::d, decltype(s)::n>(Xc, u, scale, run);
  });
  return run.result();
}

// The observations of a BN matrix completion, checked as pysharp._core's launchers check
// them, in device memory (the model's pointers point there).
struct DeviceBNMc {
  DeviceBuffer<int> rows, cols;
  DeviceBuffer<double> u;
  BNMatrixCompletion<double> m;

  DeviceBNMc(const carray<int>& rows_, const carray<int>& cols_, const carray<double>& u_,
             double scale, int m1, int m2, int r, const carray<double>& W0)
      : rows(checked(rows_, cols_, u_, m1, m2, r)), cols(DeviceBuffer<int>::from(cols_)),
        u(DeviceBuffer<double>::from(u_)),
        m{rows.get(), cols.get(), u.get(), scale, static_cast<int>(u_.size()), m1, m2, r} {
    require(W0.ndim() == 2 && W0.shape(1) == m.dim(), "W0 must be (B, (m1 + m2) r)");
  }
  static DeviceBuffer<int> checked(const carray<int>& rows, const carray<int>& cols,
                                   const carray<double>& u, int m1, int m2, int r) {
    module::check_bn_mc_observations(rows, cols, u, m1, m2, r);
    return DeviceBuffer<int>::from(rows);
  }
};

py::tuple bn_mc_gd_wd(const carray<int>& rows, const carray<int>& cols, const carray<double>& u,
                      double scale, int m1, int m2, int r, const carray<double>& W0,
                      const carray<double>& lr, const carray<double>& wd, long long steps,
                      long long record_every, const std::optional<carray<double>>& v1) {
  const DeviceBNMc dev(rows, cols, u, scale, m1, m2, r, W0);
  const BNMatrixCompletion<double>& m = dev.m;
  const int optin = block_smem_optin();
  require(tile::bn_mc_tile_fits(m.dim(), m.N, optin),
          "the model is too large for the BN matrix completion tile on this device "
          "(see _tile_bn_mc_fits)");
  TileRun run(W0, lr, wd, steps, record_every, v1);
  const int per_thread = tile::bn_mc_thread_doubles(m) * static_cast<int>(sizeof(double));
  const int fit = optin / per_thread / 32 * 32;  // >= 32: bn_mc_tile_fits
  const int threads = fit < cuda::kTileThreads ? fit : cuda::kTileThreads;
  auto kernel = cuda::bn_mc_gd_wd_tile_kernel;
  const int smem = threads * per_thread;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
        "shared memory of the tile kernel");
  const int blocks = persistent_blocks(kernel, smem, (run.B + threads - 1) / threads, threads);
  kernel<<<blocks, threads, smem>>>(m, run.io());
  finish_launch("bn_mc_gd_wd_tile_kernel");
  return run.result();
}

py::tuple bn_mc_warp_gd_wd(const carray<int>& rows, const carray<int>& cols,
                           const carray<double>& u, double scale, int m1, int m2, int r,
                           const carray<double>& W0, const carray<double>& lr,
                           const carray<double>& wd, long long steps, long long record_every,
                           const std::optional<carray<double>>& v1) {
  const DeviceBNMc dev(rows, cols, u, scale, m1, m2, r, W0);
  const int D = dev.m.dim(), N = dev.m.N;
  const int optin = block_smem_optin();
  require(tile::bn_mc_warp_tile_fits(D, N, optin),
          "the model is too large for the BN matrix completion warp tile on this device "
          "(see _tile_bn_mc_warp_fits)");
  TileRun run(W0, lr, wd, steps, record_every, v1);
  const tile::BNMcWarpTerms terms(BNMatrixCompletion<double>{
      rows.data(), cols.data(), u.data(), dev.m.scale, N, m1, m2, r});
  const DeviceBuffer<int> pass_d(terms.pass_start.data(), terms.pass_start.size()),
      obs_d(terms.obs.data(), terms.obs.size()), other_d(terms.other.data(), terms.other.size());
  const tile::BNMcWarpData data{dev.m, pass_d.get(), obs_d.get(), other_d.get()};
  // Warps per block: the most warps per multiprocessor, then the larger block.
  const int per_warp =
      static_cast<int>(tile::bn_mc_warp_doubles(D, N)) * static_cast<int>(sizeof(double));
  const int most = optin / per_warp < cuda::kTileWarps ? optin / per_warp : cuda::kTileWarps;
  auto kernel = cuda::bn_mc_warp_gd_wd_tile_kernel;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             most * per_warp),
        "shared memory of the tile kernel");
  int warps = 1, best = 0;
  for (int w = most; w >= 1; --w) {
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * w, w * per_warp),
          "occupancy");
    if (per_sm * w > best) {
      best = per_sm * w;
      warps = w;
    }
  }
  const int smem = warps * per_warp;
  const int blocks =
      persistent_blocks(kernel, smem, (run.B + warps - 1) / warps, 32 * warps);
  kernel<<<blocks, 32 * warps, smem>>>(data, run.io());
  finish_launch("bn_mc_warp_gd_wd_tile_kernel");
  return run.result();
}

py::tuple toy3d_gd_wd(double c, const carray<double>& W0, const carray<double>& lr,
                      const carray<double>& wd, long long steps, long long record_every,
                      const std::optional<carray<double>>& v1) {
  require(W0.ndim() == 2 && W0.shape(1) == 3, "W0 must be (B, 3)");
  TileRun run(W0, lr, wd, steps, record_every, v1);
  auto kernel = cuda::toy3d_gd_wd_tile_kernel;
  const int blocks =
      persistent_blocks(kernel, 0, (run.B + cuda::kTileThreads - 1) / cuda::kTileThreads);
  kernel<<<blocks, cuda::kTileThreads>>>(Toy3D<double>{c}, run.io());
  finish_launch("toy3d_gd_wd_tile_kernel");
  return run.result();
}

}  // namespace

void bind_tile(py::module_& m) {
  m.attr("_TILE_BN_LINREG_SHAPES") = module::shape_list<Shapes>();
  m.def(
      "_tile_bn_linreg_fits",
      [](int d, int n) { return module::has_shape<Shapes>(d, n) && has_fp64_mma(); },
      py::arg("d"), py::arg("n"),
      "Whether BN linear regression with d coordinates and n samples runs on the tile: a "
      "kernel compiled for (d, n) (_TILE_BN_LINREG_SHAPES) and FP64 mma on this device.");
  m.def("_tile_bn_linreg_gd_wd", &bn_linreg_gd_wd, py::arg("Xc"), py::arg("u"),
        py::arg("scale"), py::arg("W0"), py::arg("lr"), py::arg("wd"), py::arg("steps"),
        py::arg("record_every"), py::arg("v1") = py::none(),
        "GD+WD on BN linear regression on the device's tile kernel: (w_final (B, d), "
        "loss (R, B), norm2 (R, B), diverged (B,), diverged_step (B,), eff_lr (R, B), "
        "grad_norm (R, B), top_grad (R, B): ||w|| v1 . grad L(w), given unit vectors v1 "
        "(B, d); (0, B) without).");
  m.def(
      "_tile_bn_mc_fits",
      [](int D, int N) { return tile::bn_mc_tile_fits(D, N, block_smem_optin()); },
      py::arg("D"), py::arg("N"),
      "Whether BN matrix completion with D coordinates and N observations runs on the tile "
      "(the current device's shared memory per block).");
  m.def("_tile_bn_mc_gd_wd", &bn_mc_gd_wd, py::arg("rows"), py::arg("cols"), py::arg("u"),
        py::arg("scale"), py::arg("m1"), py::arg("m2"), py::arg("r"), py::arg("W0"),
        py::arg("lr"), py::arg("wd"), py::arg("steps"), py::arg("record_every"),
        py::arg("v1") = py::none(),
        "GD+WD on BN matrix completion on the device's tile kernel: the same tuple as "
        "_tile_bn_linreg_gd_wd.");
  m.def(
      "_tile_bn_mc_warp_fits",
      [](int D, int N) { return tile::bn_mc_warp_tile_fits(D, N, block_smem_optin()); },
      py::arg("D"), py::arg("N"),
      "Whether BN matrix completion with D coordinates and N observations runs on the warp "
      "tile (the current device's shared memory per block).");
  m.def("_tile_bn_mc_warp_gd_wd", &bn_mc_warp_gd_wd, py::arg("rows"), py::arg("cols"),
        py::arg("u"), py::arg("scale"), py::arg("m1"), py::arg("m2"), py::arg("r"),
        py::arg("W0"), py::arg("lr"), py::arg("wd"), py::arg("steps"), py::arg("record_every"),
        py::arg("v1") = py::none(),
        "GD+WD on BN matrix completion on the device's warp tile kernel (a warp per "
        "trajectory): the same tuple as _tile_bn_linreg_gd_wd.");
  m.def("_tile_toy3d_gd_wd", &toy3d_gd_wd, py::arg("c"), py::arg("W0"), py::arg("lr"),
        py::arg("wd"), py::arg("steps"), py::arg("record_every"), py::arg("v1") = py::none(),
        "GD+WD on Toy3D on the device's tile kernel: the same tuple as _tile_bn_linreg_gd_wd.");
}

}  // namespace pysharp::cuda_module
