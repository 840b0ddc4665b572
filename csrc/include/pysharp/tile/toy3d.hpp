// GD+WD on the 3-D toy loss, one thread per trajectory: the iterate, gradient and
// hyperparameters in registers, all steps in one loop, the model's own loss_grad
// (models/toy3d.hpp) for the math. The CPU tests call the same function for each
// trajectory in turn; the kernel calls it once per thread.
//
// Steps, records and divergence are those of engine/trajectory.hpp's GD+WD: at step t
// the loss and gradient at w_t (flagged at t if undefined or not finite, with ||w||^2
// and ||grad||^2), the loss, ||w||^2, effective LR and ||grad L(theta)|| recorded at
// t = 0, every, 2 every, ...; the
// update w+ = (1 - lr wd) w - lr grad (flagged at t + 1 if not finite). A flagged
// trajectory keeps its last finite iterate; the records it did not reach are NaN.
#pragma once

#include <cstdint>

#include "pysharp/models/toy3d.hpp"
#include "pysharp/tile/gd_wd_io.hpp"
#include "pysharp/tile/warp.hpp"

namespace pysharp::tile {

// Trajectory b of the batch, start to finish.
PYSHARP_TILE_HD void toy3d_gd_wd_thread(const Toy3D<double>& m, long long b,
                                        const GdWdTileIO& io) {
  double w[3], g[3], loss = 0.0;
  for (int i = 0; i < 3; ++i) w[i] = io.w0[3 * b + i];
  const double lr = io.lr[b], decay = 1.0 - lr * io.wd[b];
  long long div_step = -1, r = 0, next_record = 0;
  for (long long t = 0; t <= io.steps; ++t) {
    const bool defined = m.loss_grad(w, &loss, g, static_cast<double*>(nullptr));
    double norm2 = 0.0, gnorm2 = 0.0;  // in index order, as lane_dot sums
    for (int i = 0; i < 3; ++i) norm2 += w[i] * w[i];
    for (int i = 0; i < 3; ++i) gnorm2 += g[i] * g[i];
    if (!(defined && finite(loss) && finite(norm2) && finite(gnorm2))) {
      div_step = t;
      break;
    }
    if (t == next_record) {
      io.loss[r * io.batch + b] = loss;
      io.norm2[r * io.batch + b] = norm2;
      io.grad_norm[r * io.batch + b] = gnorm2;  // ||grad L(w)||^2 until below
      ++r;
      next_record += io.record_every;
    }
    if (t == io.steps) break;
    double wn[3];
    bool fine = true;
    for (int i = 0; i < 3; ++i) {
      wn[i] = decay * w[i] - lr * g[i];
      fine = fine && finite(wn[i]);
    }
    if (!fine) {
      div_step = t + 1;
      break;
    }
    for (int i = 0; i < 3; ++i) w[i] = wn[i];
  }
  // The effective LR and ||grad L(theta)|| = ||w|| ||grad L(w)|| of the records reached,
  // out of the step loop; the others are NaN.
  PYSHARP_ROLLED
  for (long long k = 0; k < r; ++k) {
    const long long at = k * io.batch + b;
    const double n2 = io.norm2[at];
    io.eff_lr[at] = lr / (decay * n2);
    io.grad_norm[at] = root(n2) * root(io.grad_norm[at]);
  }
  const long long n_rec = io.steps / io.record_every + 1;
  const double nan = __builtin_nan("");
  for (; r < n_rec; ++r) {
    const long long at = r * io.batch + b;
    io.loss[at] = io.norm2[at] = io.eff_lr[at] = io.grad_norm[at] = nan;
  }
  for (int i = 0; i < 3; ++i) io.w_final[3 * b + i] = w[i];
  io.diverged[b] = div_step >= 0;
  io.diverged_step[b] = div_step;
}

}  // namespace pysharp::tile
