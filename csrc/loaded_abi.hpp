// The binary interface of a run-time compiled model (pysharp.models.load_model).
//
// The model's library exports one function, pysharp_loaded_table(), whose Table holds
// the struct's field records (model_concept.hpp) and its kernels, trajectory engine,
// Lanczos, SLQ and SGD as plain functions of the struct's address. pysharp._core binds
// the Table once per precision (bind_loaded.cpp) and holds the struct, so the library
// holds no Python binding code: no pybind11 to parse and compile for every model.
// The generated translation unit is three lines,
//
//   #include "/path/to/the/users/model.hpp"
//   #include "loaded_abi.hpp"
//   PYSHARP_LOADED_LIBRARY(PhaseRetrieval, double)
//
// so that the compiler's diagnostics point at the user's file and line.
//
// The library is compiled with the core's compiler and flags against the core's headers
// (pysharp/models/_compiler.py keys its cache on them); the structs passed between the
// two by reference must still have one layout, which Sizes checks when _core opens a
// table (a core rebuilt from other headers refuses the library, and it is compiled again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "cpu/batched.hpp"
#include "cpu/engine.hpp"
#include "cpu/sgd.hpp"
#include "cpu/slq.hpp"
#include "model_concept.hpp"

namespace pysharp::loaded {

using declared::FieldRecord;

// The version of Table's layout: a change to Table increments it.
inline constexpr int kAbiVersion = 2;

// sizeof each struct that crosses between _core and a library.
struct Sizes {
  std::size_t real, engine_config, lanczos_options, hyperparameters, batch_records, sgd_config,
      field_record;
};

template <class Real>
constexpr Sizes sizes_of() {
  return {sizeof(Real),
          sizeof(EngineConfig),
          sizeof(LanczosOptions),
          sizeof(Hyperparameters<Real>),
          sizeof(BatchRecords<Real>),
          sizeof(SGDConfig),
          sizeof(FieldRecord)};
}

inline bool operator==(const Sizes& a, const Sizes& b) {
  return a.real == b.real && a.engine_config == b.engine_config &&
         a.lanczos_options == b.lanczos_options && a.hyperparameters == b.hyperparameters &&
         a.batch_records == b.batch_records && a.sgd_config == b.sgd_config &&
         a.field_record == b.field_record;
}

// One model in one precision. `model` is the address of a struct the library's
// construct() built and _core filled from the field records.
template <class Real>
struct Table {
  int abi_version;
  Sizes sizes;
  const char* model_name;
  bool square_loss;
  std::size_t model_size, model_align;
  const FieldRecord* fields;
  int n_fields;
  bool declares_group_begin;
  void (*construct)(void* storage);  // Model{} in model_size bytes aligned to model_align
  void (*destroy)(void* model);      // ~Model(), before _core frees the storage
  int (*dim)(const void* model);
  int (*work_size)(const void* model);
  int (*n_groups)(const void* model);
  int (*group_begin)(const void* model, int k);
  // the kernels (cpu/batched.hpp)
  void (*loss_grad)(const void* model, const Real* W, std::int64_t B, Real* loss, Real* G,
                    std::uint8_t* ok);
  void (*hvp)(const void* model, const Real* W, const Real* V, std::int64_t B, Real* out,
              std::uint8_t* ok);
  void (*third)(const void* model, const Real* W, const Real* V, std::int64_t B, Real* out,
                std::uint8_t* ok);
  void (*hessian)(const void* model, const Real* W, std::int64_t B, Real* H, std::uint8_t* ok);
  // SLQ (cpu/slq.hpp): float64 libraries only, else null
  void (*slq)(const void* model, const Real* W, std::int64_t B, int P, int steps,
              std::uint64_t seed, Real* alpha, Real* beta, Real* nodes, Real* weights,
              int* count, std::uint8_t* ok);
  // Lanczos and the trajectory engine (cpu/engine.hpp): scale-invariant models, else null
  void (*lanczos)(const void* model, const LanczosOptions& o, const Real* W, const Real* start,
                  const std::uint64_t* streams, long long B, Real* evals, Real* evecs,
                  Real* resid, int* iterations, std::uint8_t* converged, std::uint8_t* ok);
  void (*run)(const void* model, const EngineConfig& c, const Real* W0,
              const Hyperparameters<Real>& h, long long B, long long offset,
              const BatchRecords<Real>& out);
  // the SGD tools (cpu/sgd.hpp): square-loss models, else null
  int (*n_samples)(const void* model);
  int (*input_dim)(const void* model);
  int (*sgd_min_batch)(const void* model);
  void (*jacobians)(const void* model, const Real* W, std::int64_t P, Real* F, Real* A,
                    Real* GX);
  void (*sgd)(const void* model, const SGDConfig& c, Real* W, const Real* lr, const int* batch,
              const Real* wd, std::int64_t T, std::int64_t offset, Real* loss,
              std::uint8_t* diverged, long long* diverged_step);
};

// Table's functions for one Model: each casts the address back and calls the CPU code.
template <class Model, class Real>
struct Entries {
  static const Model& m(const void* p) { return *static_cast<const Model*>(p); }
  static void construct(void* storage) { new (storage) Model{}; }
  static void destroy(void* p) { static_cast<Model*>(p)->~Model(); }
  static int dim(const void* p) { return m(p).dim(); }
  static int work_size(const void* p) { return m(p).work_size(); }
  static int n_groups(const void* p) { return pysharp::n_groups(m(p)); }
  static int group_begin(const void* p, int k) { return pysharp::group_begin(m(p), k); }
  static void loss_grad(const void* p, const Real* W, std::int64_t B, Real* loss, Real* G,
                        std::uint8_t* ok) {
    cpu::loss_grad(m(p), W, B, loss, G, ok);
  }
  template <int N>
  static void directional(const void* p, const Real* W, const Real* V, std::int64_t B,
                          Real* out, std::uint8_t* ok) {
    cpu::directional<N>(m(p), W, V, B, out, ok);
  }
  static void hessian(const void* p, const Real* W, std::int64_t B, Real* H, std::uint8_t* ok) {
    cpu::hessian(m(p), W, B, H, ok);
  }
  static void slq(const void* p, const Real* W, std::int64_t B, int P, int steps,
                  std::uint64_t seed, Real* alpha, Real* beta, Real* nodes, Real* weights,
                  int* count, std::uint8_t* ok) {
    cpu::slq_batch(m(p), W, B, P, steps, seed, alpha, beta, nodes, weights, count, ok);
  }
  static void lanczos(const void* p, const LanczosOptions& o, const Real* W, const Real* start,
                      const std::uint64_t* streams, long long B, Real* evals, Real* evecs,
                      Real* resid, int* iterations, std::uint8_t* converged, std::uint8_t* ok) {
    cpu::lanczos_batch(m(p), o, W, start, streams, B, evals, evecs, resid, iterations,
                       converged, ok);
  }
  static void run(const void* p, const EngineConfig& c, const Real* W0,
                  const Hyperparameters<Real>& h, long long B, long long offset,
                  const BatchRecords<Real>& out) {
    cpu::run_batch(m(p), c, W0, h, B, offset, out);
  }
  static int n_samples(const void* p) { return m(p).n_samples(); }
  static int input_dim(const void* p) { return m(p).input_dim(); }
  static int sgd_min_batch(const void* p) { return pysharp::sgd_min_batch(m(p)); }
  static void jacobians(const void* p, const Real* W, std::int64_t P, Real* F, Real* A,
                        Real* GX) {
    cpu::jacobians(m(p), W, P, F, A, GX);
  }
  static void sgd(const void* p, const SGDConfig& c, Real* W, const Real* lr, const int* batch,
                  const Real* wd, std::int64_t T, std::int64_t offset, Real* loss,
                  std::uint8_t* diverged, long long* diverged_step) {
    cpu::sgd_batch(m(p), c, W, lr, batch, wd, T, offset, loss, diverged, diverged_step);
  }
};

// The table of Model in precision Real, built once. A square-loss model (it has
// jacobian()) gets the SGD tools; the engine of the scale-invariant runs (sphere,
// projections, EoS tracking) is for the others only, as for the built-ins.
template <class Model, class Real>
const Table<Real>* table() {
  static_assert(declared::check_concept<Model, Real>());
  using E = Entries<Model, Real>;
  static const std::vector<FieldRecord> fields = declared::field_records<Model>();
  static const Table<Real> t = [] {
    Table<Real> t{};
    t.abi_version = kAbiVersion;
    t.sizes = sizes_of<Real>();
    t.model_name = pysharp_model_name(static_cast<const Model*>(nullptr));
    t.model_size = sizeof(Model);
    t.model_align = alignof(Model);
    t.fields = fields.data();
    t.n_fields = static_cast<int>(fields.size());
    t.declares_group_begin = has_group_begin<Model>::value;
    t.construct = E::construct;
    t.destroy = E::destroy;
    t.dim = E::dim;
    t.work_size = E::work_size;
    t.n_groups = E::n_groups;
    t.group_begin = E::group_begin;
    t.loss_grad = E::loss_grad;
    t.hvp = E::template directional<1>;
    t.third = E::template directional<2>;
    t.hessian = E::hessian;
    if constexpr (std::is_same_v<Real, double>) t.slq = E::slq;
    if constexpr (declared::is_square_loss<Model, Real>()) {
      t.square_loss = true;
      t.n_samples = E::n_samples;
      t.input_dim = E::input_dim;
      t.sgd_min_batch = E::sgd_min_batch;
      t.jacobians = E::jacobians;
      t.sgd = E::sgd;
    } else {
      t.lanczos = E::lanczos;
      t.run = E::run;
    }
    return t;
  }();
  return &t;
}

}  // namespace pysharp::loaded

// The library's one export: the table of one model in one precision.
#define PYSHARP_LOADED_LIBRARY(Model, Real)                                              \
  extern "C" __attribute__((visibility("default"))) const void* pysharp_loaded_table() { \
    return ::pysharp::loaded::table<Model<Real>, Real>();                                 \
  }
