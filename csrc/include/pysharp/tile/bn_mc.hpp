// GD+WD on BN matrix completion, one thread per trajectory (tile/gd_wd_thread.hpp), the
// model's own loss_grad on the thread's scratch: w and g (D each), the N scores and the
// loss. On the device the scratches lie end to end in shared memory (too many doubles for
// registers at D 80), the observation lists are read in the same order by every thread of
// a warp (broadcasts), and every sum runs in the model's fixed order: no atomics.
#pragma once

#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/tile/gd_wd_thread.hpp"

namespace pysharp::tile {

// The doubles of one thread's scratch (w and g, D each, N scores, the loss), rounded up to
// an odd count: the scratches of consecutive threads then start in different shared-memory
// banks, and a warp reading the same entry of each is conflict-free.
PYSHARP_TILE_HD int bn_mc_thread_doubles(int D, int N) { return (2 * D + N + 1) | 1; }
// The same count, written out: through the (D, N) overload, ptxas (nvcc 13, sm_90) gave the
// kernel a 16 B stack frame and 24 B of spills. tests/csrc/test_tile.py's gate would say.
PYSHARP_TILE_HD int bn_mc_thread_doubles(const BNMatrixCompletion<double>& m) {
  return (2 * m.dim() + m.N + 1) | 1;
}

// The largest scratch the tile takes (4 KB): at that size a warp's scratches (128 KB) still
// fit in the shared memory of an A100, H100 or H200 block (163-227 KB), one warp a block.
// A device with less shared memory per block lowers the limit (bn_mc_tile_fits); larger
// models (the D 800 benchmark needs 1801) run on the generic engine.
inline constexpr int kBnMcMaxThreadDoubles = 511;

// Whether a model of D coordinates and N observations runs on the tile, given the shared
// memory one block may have (bytes): a warp's scratches must fit, within the cap above.
// pysharp's BNMatrixCompletion._tile_kernel asks the module (_tile_bn_mc_fits).
PYSHARP_TILE_HD bool bn_mc_tile_fits(int D, int N, long long block_smem_bytes) {
  const int doubles = bn_mc_thread_doubles(D, N);
  return doubles <= kBnMcMaxThreadDoubles &&
         32LL * doubles * static_cast<long long>(sizeof(double)) <= block_smem_bytes;
}

// Whether every observation lies inside the (m1, m2) matrix: the kernel indexes the
// factors by them unchecked, so the bindings refuse lists that do not.
PYSHARP_TILE_HD bool bn_mc_observations_inside(const int* rows, const int* cols, long long N,
                                               int m1, int m2) {
  for (long long k = 0; k < N; ++k)
    if (rows[k] < 0 || rows[k] >= m1 || cols[k] < 0 || cols[k] >= m2) return false;
  return true;
}

PYSHARP_TILE_HD void bn_mc_gd_wd_thread(const BNMatrixCompletion<double>& m, long long b,
                                        const GdWdTileIO& io, double* scratch) {
  const int D = m.dim();
  gd_wd_thread(m, b, io, scratch, scratch + D, scratch + 2 * D, scratch + 2 * D + m.N);
}

}  // namespace pysharp::tile
