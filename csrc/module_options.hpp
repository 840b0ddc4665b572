// Host-side argument checks and engine options shared by the two extension
// modules, pysharp._core (bindings.cpp) and pysharp._cuda (cuda/module.cu),
// so both accept and refuse exactly the same calls.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "pysharp/engine/trajectory.hpp"

namespace pysharp::module {

inline void require(bool cond, const std::string& what) {
  if (!cond) throw std::invalid_argument(what);
}

// smallest: the k smallest algebraic eigenvalues instead of the largest.
inline LanczosOptions lanczos_options(int D, int k, int max_iter, int min_iter, double tol,
                                      std::uint64_t seed, bool smallest = false) {
  require(k >= 1 && k <= D, "k must be in [1, D]");
  require(max_iter >= k && max_iter <= D && max_iter <= kLanczosMaxIter,
          "max_iter must be in [k, min(D, " + std::to_string(kLanczosMaxIter) + ")]");
  LanczosOptions o;
  o.k = k;
  o.smallest = smallest;
  o.max_iter = max_iter;
  o.min_iter = min_iter;
  o.tol = tol;
  o.seed = seed;
  return o;
}

// The configuration of a `run` call, checked. can_reduce: the model has the
// exact reduced update (BN linear regression).
inline EngineConfig engine_config(int D, int method, long long steps, long long record_every,
                                  long long sharpness_every, long long theta_every,
                                  double jitter, std::uint64_t seed, double rms_beta,
                                  double rms_eps, int lanczos_max_iter, int lanczos_min_iter,
                                  double lanczos_tol, bool reduced, bool can_reduce) {
  require(method >= 0 && method <= 3, "unknown method");
  require(steps >= 0 && record_every >= 1 && sharpness_every >= 0 && theta_every >= 0,
          "steps >= 0, record_every >= 1, sharpness_every >= 0, theta_every >= 0");
  EngineConfig cfg;
  cfg.method = static_cast<Method>(method);
  cfg.steps = steps;
  cfg.record_every = record_every;
  cfg.sharpness_every = sharpness_every;
  cfg.theta_every = theta_every;
  cfg.jitter = jitter;
  cfg.seed = seed;
  cfg.rms_beta = rms_beta;
  cfg.rms_eps = rms_eps;
  cfg.lanczos = lanczos_options(D, 1, lanczos_max_iter, lanczos_min_iter, lanczos_tol, seed);
  require(!reduced || (can_reduce && jitter == 0 &&
                       (cfg.method == Method::gd_wd || cfg.method == Method::scalar_rmsprop)),
          "the reduced update exists for BN linear regression, GD+WD or scalar RMSprop, "
          "without jitter");
  return cfg;
}

}  // namespace pysharp::module
