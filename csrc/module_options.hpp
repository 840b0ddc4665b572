// Host-side argument checks and engine options shared by the two extension
// modules, pysharp._core (bindings.cpp) and pysharp._cuda (cuda/module.cu),
// so both accept and refuse exactly the same calls.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <set>
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

// Fields of a Python dict read by name, each once; done() refuses the keys nobody read,
// so a misspelt or stale field is an error rather than a silent default.
class Fields {
 public:
  Fields(const pybind11::dict& d, std::string what) : d_(d), what_(std::move(what)) {}
  template <class T>
  T get(const char* name) {
    require(d_.contains(name), what_ + " lacks the field '" + name + "'");
    read_.insert(name);
    return d_[name].cast<T>();
  }
  void done() const {
    for (auto item : d_) {
      const std::string key = pybind11::str(item.first);
      require(read_.count(key) != 0, what_ + " has an unknown field '" + key + "'");
    }
  }

 private:
  const pybind11::dict& d_;
  std::string what_;
  std::set<std::string> read_;
};

// LanczosOptions from the dict of pysharp._engine.LanczosOptions.to_core().
inline LanczosOptions lanczos_options_from(const pybind11::dict& d, int D) {
  Fields f(d, "LanczosOptions");
  const int k = f.get<int>("k"), max_iter = f.get<int>("max_iter");
  const int min_iter = f.get<int>("min_iter");
  const double tol = f.get<double>("tol");
  const auto seed = f.get<std::uint64_t>("seed");
  const bool smallest = f.get<bool>("smallest");
  f.done();
  return lanczos_options(D, k, max_iter, min_iter, tol, seed, smallest);
}

// The names and values of the update rules (the method table, engine/methods.hpp).
inline pybind11::dict method_names() {
  pybind11::dict m;
  for (int i = 0; i < kMethodCount; ++i) m[kMethodNames[i]] = i;
  return m;
}

// EngineConfig from the dict of pysharp._engine.EngineConfig.to_core(), checked.
// can_reduce: the model has the exact reduced update (BN linear regression);
// *reduced receives whether the call asks for it.
inline EngineConfig engine_config_from(const pybind11::dict& d, int D, bool can_reduce,
                                       bool* reduced) {
  Fields f(d, "EngineConfig");
  EngineConfig cfg;
  const int method = f.get<int>("method");
  require(method >= 0 && method < kMethodCount, "unknown method");
  cfg.method = static_cast<Method>(method);
  cfg.steps = f.get<long long>("steps");
  cfg.record_every = f.get<long long>("record_every");
  cfg.sharpness_every = f.get<long long>("sharpness_every");
  cfg.theta_every = f.get<long long>("theta_every");
  require(cfg.steps >= 0 && cfg.record_every >= 1 && cfg.sharpness_every >= 0 &&
              cfg.theta_every >= 0,
          "steps >= 0, record_every >= 1, sharpness_every >= 0, theta_every >= 0");
  cfg.jitter = f.get<double>("jitter");
  cfg.seed = f.get<std::uint64_t>("seed");
  cfg.rms_beta = f.get<double>("rms_beta");
  cfg.rms_eps = f.get<double>("rms_eps");
  cfg.qr_kappa = f.get<double>("qr_kappa");
  cfg.top_k = f.get<int>("top_k");
  *reduced = f.get<bool>("reduced");
  cfg.lanczos = lanczos_options_from(f.get<pybind11::dict>("lanczos"), D);
  f.done();
  require(cfg.lanczos.k == 1 && !cfg.lanczos.smallest,
          "the engine's in-run sharpness is the top eigenvalue: LanczosOptions k = 1, LA");
  require(cfg.top_k == 0 || (cfg.top_k >= 2 && cfg.top_k <= cfg.lanczos.max_iter),
          "top_k must be 0 (off) or in [2, lanczos max_iter]");
  require(!*reduced || (can_reduce && cfg.jitter == 0 &&
                        method_has_reduced(cfg.method)),
          "the reduced update exists for BN linear regression, GD+WD or scalar RMSprop, "
          "without jitter");
  return cfg;
}

}  // namespace pysharp::module
