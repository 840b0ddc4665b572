// The fused tile kernels of the GPU engine (issue 28): one persistent launch runs all
// steps of GD+WD, the state in registers (BN linear regression, Toy3D) or shared memory
// (BN matrix completion: a thread per trajectory, or a warp for large models), the data in
// shared or read-only global memory. The per-tile
// algorithms live in csrc/include/pysharp/tile/ and are written once over a warp policy
// (DeviceWarp here, EmuWarp in the CPU tests through pysharp._core's _tile_* helpers) or
// once for a thread (tile/gd_wd_thread.hpp).
//
// The BN linear regression kernels are specialised at compile time on the model's shapes
// (tile_kernels.cu instantiates the benchmark's); the thread tiles take theirs at run time.
// tests/csrc/test_tile.py compiles that file with nvcc and fails on any spill or stack
// frame in a kernel whose name contains "tile".
//
// pysharp._cuda launches them as _tile_* functions (bind_tile.cu), and backend="cuda" runs
// GD+WD on them where they apply (pysharp/_backends/_tiles.py); what remains is the
// measurements on a device (docs/architecture.rst, "Fused GPU tiles").
#pragma once

#include <cstdint>

#include "pysharp/tile/bn_linreg.hpp"
#include "pysharp/tile/bn_mc.hpp"
#include "pysharp/tile/bn_mc_warp.hpp"
#include "pysharp/tile/toy3d.hpp"

namespace pysharp::cuda {

inline constexpr int kTileWarps = 8;  // warps per block of a tile kernel
inline constexpr int kTileThreads = 32 * kTileWarps;

// Shared memory of the BN linear regression tile kernel: Xc and u in tile layout.
template <int D, int N>
constexpr int bn_linreg_tile_smem_bytes() {
  using Tile = tile::BNLinRegTile<tile::DeviceWarp, D, N>;
  return (Tile::NP * Tile::DP + Tile::NP + kTileWarps * Tile::kParkDoubles) *
         static_cast<int>(sizeof(double));
}

// GD+WD on BN linear regression, 8 trajectories per warp (one tile), trajectory b in
// row b % 8 of tile b / 8. Persistent: launch about as many blocks as fit on the SMs at
// once; warp k of the grid runs tiles k, k + warps of the grid, ... to the end.
// data.xc, data.u: the tile layout (tile::pack_bn_linreg) in global memory, copied to
// shared memory once per block, beside each warp's parking area (Tile::kParkW);
// dynamic shared memory bn_linreg_tile_smem_bytes<D, N>() (over 48 KB: opt in with
// cudaFuncSetAttribute; d100 n200 needs 221 KB of the 227 KB an H100/H200 block may have).
template <int D, int N>
__global__ void __launch_bounds__(kTileThreads, 1)
    bn_linreg_gd_wd_tile_kernel(tile::BNLinRegTileData data, tile::GdWdTileIO io) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // FP64 mma needs sm_80+ (and an emulation by shuffles took ptxas minutes)
#else
  using Tile = tile::BNLinRegTile<tile::DeviceWarp, D, N>;
  extern __shared__ double smem[];
  constexpr int kXc = Tile::NP * Tile::DP;
  for (int k = threadIdx.x; k < kXc + Tile::NP; k += blockDim.x)
    smem[k] = k < kXc ? data.xc[k] : data.u[k - kXc];
  __syncthreads();
  const Tile t{{smem, smem + kXc, data.scale, data.floor_coef}};
  const int warps = blockDim.x / 32, lane = threadIdx.x & 31;
  const long long tiles = (io.batch + 7) / 8;
  for (long long k = static_cast<long long>(blockIdx.x) * warps + threadIdx.x / 32; k < tiles;
       k += static_cast<long long>(gridDim.x) * warps) {
    const long long b = 8 * k + (lane >> 2);
    t.run(b < io.batch ? b : -1LL, io,
          smem + kXc + Tile::NP + (threadIdx.x / 32) * Tile::kParkDoubles);
  }
#endif
}

// GD+WD on BN matrix completion, one thread per trajectory, grid-stride over the batch;
// m's observation lists in global memory (every thread of a warp reads the same entry).
// Dynamic shared memory: blockDim.x scratches of tile::bn_mc_thread_doubles(m) doubles,
// end to end; the launch picks the block size that fits (bind_tile.cu).
// pysharp-run-time-shape: bn_mc_gd_wd_tile_kernel
__global__ void __launch_bounds__(kTileThreads)
    bn_mc_gd_wd_tile_kernel(BNMatrixCompletion<double> m, tile::GdWdTileIO io) {
  extern __shared__ double smem[];
  double* scratch = smem + threadIdx.x * tile::bn_mc_thread_doubles(m);
  for (long long b = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < io.batch; b += static_cast<long long>(gridDim.x) * blockDim.x)
    tile::bn_mc_gd_wd_thread(m, b, io, scratch);
}

// GD+WD on BN matrix completion, one warp per trajectory (models too large for the thread
// tile above), warp k of the grid running trajectories k, k + warps of the grid, ...;
// the observation lists and gradient terms in global memory. Dynamic shared memory: the block's warps'
// scratches of tile::bn_mc_warp_doubles(D, N) doubles, end to end; blockDim.x a multiple
// of 32 (bind_tile.cu picks the number of warps that fit).
// pysharp-run-time-shape: bn_mc_warp_gd_wd_tile_kernel
__global__ void __launch_bounds__(kTileThreads)
    bn_mc_warp_gd_wd_tile_kernel(tile::BNMcWarpData data, tile::GdWdTileIO io) {
  extern __shared__ double smem[];
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  double* scratch = smem + warp * tile::bn_mc_warp_doubles(data.m.dim(), data.m.N);
  const tile::BNMcWarpTile<tile::DeviceWarp> t{data};
  for (long long b = static_cast<long long>(blockIdx.x) * warps + warp; b < io.batch;
       b += static_cast<long long>(gridDim.x) * warps)
    t.run(b, io, scratch);
}

// GD+WD on Toy3D, one thread per trajectory, grid-stride over the batch.
__global__ void __launch_bounds__(kTileThreads)
    toy3d_gd_wd_tile_kernel(Toy3D<double> m, tile::GdWdTileIO io) {
  for (long long b = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < io.batch; b += static_cast<long long>(gridDim.x) * blockDim.x)
    tile::toy3d_gd_wd_thread(m, b, io);
}

}  // namespace pysharp::cuda
