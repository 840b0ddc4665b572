// What a GD+WD tile run reads and writes (global memory): B trajectories, the records
// that engine/trajectory.hpp keeps for a run without sharpness tracking (the loss, ||w||^2,
// the effective LR lr / ((1 - lr wd) ||w||^2) and ||grad L(theta)|| = ||w|| ||grad L(w)||
// at steps 0, every, 2 every, ... <= steps, the final iterate, divergence flags). Records
// are (n_records, B).
#pragma once

#include <cstdint>

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
};

}  // namespace pysharp::tile
