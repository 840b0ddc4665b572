// The tile kernels at the benchmark's shapes (bench/, gpu-design: BN linear regression
// d40 n20 and d100 n200, Toy3D), for the ptxas gate of tests/csrc/test_tile.py:
//   nvcc -std=c++17 -arch=sm_90 -cubin --expt-relaxed-constexpr -Xptxas -v \
//        -I csrc/include -I csrc csrc/cuda/tile_kernels.cu
#include "cuda/tile_kernels.cuh"

namespace pysharp::cuda {

template __global__ void bn_linreg_gd_wd_tile_kernel<40, 20>(tile::BNLinRegTileData,
                                                             tile::GdWdTileIO);
template __global__ void bn_linreg_gd_wd_tile_kernel<100, 200>(tile::BNLinRegTileData,
                                                               tile::GdWdTileIO);

}  // namespace pysharp::cuda
