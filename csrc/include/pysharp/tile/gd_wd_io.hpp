// What a GD+WD tile run reads and writes (global memory): B trajectories, the records
// that engine/trajectory.hpp keeps (the loss, ||w||^2, the effective LR
// lr / ((1 - lr wd) ||w||^2) and ||grad L(theta)|| = ||w|| ||grad L(w)|| at steps 0, every,
// 2 every, ... <= steps, the final iterate, divergence flags). Records are (n_records, B).
// Given a unit vector v1 per trajectory (the top eigenvector of a sharpness step:
// pysharp/_backends/_tiles.py runs a tracked run in segments between Lanczos solves), a run
// also records top_grad = v1 . grad L(theta) = ||w|| v1 . grad L(w).
#pragma once

#include <cstdint>

#include "pysharp/tile/warp.hpp"

namespace pysharp::tile {

// One batch's inputs and outputs (global memory), B trajectories.
struct GdWdTileIO {
  const double* w0;          // (B, D)
  const double* lr;          // (B,)
  const double* wd;          // (B,)
  double* w_final;           // (B, D)
  double* loss;              // (n_records, B)
  double* norm2;             // (n_records, B)
  double* eff_lr;            // (n_records, B)
  double* grad_norm;         // (n_records, B)
  std::uint8_t* diverged;    // (B,)
  long long* diverged_step;  // (B,), -1 if never
  long long batch;
  long long steps;
  long long record_every;
  const double* v1 = nullptr;  // (B, D), or null: no top_grad
  double* top_grad = nullptr;  // (n_records, B), written where v1 is given
};

// The end of trajectory b's run, once the step loop has stored its first `reached` records
// (the loss, ||w||^2, ||grad L(w)||^2 and, with v1, v1 . grad L(w)): the effective LR,
// ||grad L(theta)|| = ||w|| ||grad L(w)|| and top_grad = ||w|| v1 . grad L(w) of those
// records, computed here so that a division and two roots stay out of the step loop; NaN
// for the records never reached; the divergence flag and step (div_step, -1 if none).
// Scalar code, run by one thread of the trajectory.
PYSHARP_TILE_HD void gd_wd_finish(const GdWdTileIO& io, long long b, long long reached,
                                  double lr, double decay, long long div_step) {
  PYSHARP_ROLLED
  for (long long k = 0; k < reached; ++k) {
    const long long at = k * io.batch + b;
    const double n2 = io.norm2[at];
    io.eff_lr[at] = lr / (decay * n2);
    io.grad_norm[at] = root(n2) * root(io.grad_norm[at]);
    if (io.top_grad) io.top_grad[at] = root(n2) * io.top_grad[at];
  }
  const long long n_rec = io.steps / io.record_every + 1;
  const double nan = __builtin_nan("");
  for (long long k = reached; k < n_rec; ++k) {
    const long long at = k * io.batch + b;
    io.loss[at] = io.norm2[at] = io.eff_lr[at] = io.grad_norm[at] = nan;
    if (io.top_grad) io.top_grad[at] = nan;
  }
  io.diverged[b] = div_step >= 0;
  io.diverged_step[b] = div_step;
}

}  // namespace pysharp::tile
