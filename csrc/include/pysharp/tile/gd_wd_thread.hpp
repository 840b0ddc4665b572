// GD+WD with one thread per trajectory, for any model whose loss_grad runs on one point:
// all steps in one loop, the model's own loss_grad (models/) for the math. The caller
// gives the thread's scratch: the iterate w and gradient g (D each) and the model's work
// (work_size() doubles), in registers where D is small and known at compile time (Toy3D,
// tile/toy3d.hpp), in shared memory otherwise (BN matrix completion, tile/bn_mc.hpp). The
// CPU tests call the same function for each trajectory in turn; a kernel once per thread.
// The loss too is written through a pointer the caller gives: a local variable whose
// address the model's loss_grad takes stays on the stack where loss_grad is not inlined
// whole (BN matrix completion's), so there it is a slot of the scratch.
//
// Steps, records and divergence are those of engine/trajectory.hpp's GD+WD: at step t
// the loss and gradient at w_t (flagged at t if undefined or not finite, with ||w||^2
// and ||grad||^2), the loss, ||w||^2, effective LR and ||grad L(theta)|| recorded at
// t = 0, every, 2 every, ...; the update w+ = (1 - lr wd) w - lr grad (flagged at t + 1 if
// not finite). A flagged trajectory keeps its last finite iterate; the records it did not
// reach are NaN.
#pragma once

#include "pysharp/tile/gd_wd_io.hpp"
#include "pysharp/tile/warp.hpp"

namespace pysharp::tile {

// v1 . g in index order (the engine's grad_dot). In registers (kRegisters: w and g arrays
// of a compile-time D, Toy3D's) the loop must unroll; over a scratch in shared memory it
// must not: unrolled, the BN matrix completion kernel spilled under NVRTC's ptxas (CUDA
// 13.0).
template <bool kRegisters>
PYSHARP_TILE_HD double dot_in_order(const double* v, const double* g, int D) {
  double s = 0.0;
  if constexpr (kRegisters) {
    for (int i = 0; i < D; ++i) s += v[i] * g[i];
  } else {
    PYSHARP_ROLLED
    for (int i = 0; i < D; ++i) s += v[i] * g[i];
  }
  return s;
}

// Trajectory b of the batch, start to finish. kRegisters: w and g are register arrays
// (see dot_in_order).
template <bool kRegisters = false, class Model>
PYSHARP_TILE_HD void gd_wd_thread(const Model& m, long long b, const GdWdTileIO& io, double* w,
                                  double* g, double* work, double* loss) {
  const int D = m.dim();
  for (int i = 0; i < D; ++i) w[i] = io.w0[D * b + i];
  const double lr = io.lr[b], decay = 1.0 - lr * io.wd[b];
  long long div_step = -1, r = 0, next_record = 0;
  for (long long t = 0; t <= io.steps; ++t) {
    const bool defined = m.loss_grad(w, loss, g, work);
    double norm2 = 0.0, gnorm2 = 0.0;  // in index order, as lane_dot sums
    for (int i = 0; i < D; ++i) norm2 += w[i] * w[i];
    for (int i = 0; i < D; ++i) gnorm2 += g[i] * g[i];
    if (!(defined && finite(*loss) && finite(norm2) && finite(gnorm2))) {
      div_step = t;
      break;
    }
    if (t == next_record) {
      io.loss[r * io.batch + b] = *loss;
      io.norm2[r * io.batch + b] = norm2;
      io.grad_norm[r * io.batch + b] = gnorm2;  // ||grad L(w)||^2 until below
      if (io.top_grad)  // v1 . grad L(w), times ||w|| in gd_wd_finish
        io.top_grad[r * io.batch + b] = dot_in_order<kRegisters>(io.v1 + D * b, g, D);
      ++r;
      next_record += io.record_every;
    }
    if (t == io.steps) break;
    // The update is checked whole before it is stored: a step that overflows leaves the
    // last finite iterate. Both loops compute the same expression, hence the same value.
    bool fine = true;
    for (int i = 0; i < D; ++i) fine = fine && finite(decay * w[i] - lr * g[i]);
    if (!fine) {
      div_step = t + 1;
      break;
    }
    for (int i = 0; i < D; ++i) w[i] = decay * w[i] - lr * g[i];
  }
  gd_wd_finish(io, b, r, lr, decay, div_step);
  for (int i = 0; i < D; ++i) io.w_final[D * b + i] = w[i];
}

}  // namespace pysharp::tile
