// GD+WD on the 3-D toy loss, one thread per trajectory (tile/gd_wd_thread.hpp): the
// iterate, gradient and hyperparameters in registers.
#pragma once

#include "pysharp/models/toy3d.hpp"
#include "pysharp/tile/gd_wd_thread.hpp"

namespace pysharp::tile {

PYSHARP_TILE_HD void toy3d_gd_wd_thread(const Toy3D<double>& m, long long b,
                                        const GdWdTileIO& io) {
  double w[3], g[3], loss = 0.0;
  gd_wd_thread<true>(m, b, io, w, g, static_cast<double*>(nullptr), &loss);
}

}  // namespace pysharp::tile
