// What a GD+WD tile run reads and writes (global memory): B trajectories, the records
// that engine/trajectory.hpp keeps for a run (the loss and ||w||^2 at steps 0, every,
// 2 every, ... <= steps, the final iterate, divergence flags). Records are (n_records, B).
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
  std::uint8_t* diverged;    // (B,)
  long long* diverged_step;  // (B,), -1 if never
  long long batch;
  long long steps;
  long long record_every;
};

}  // namespace pysharp::tile
