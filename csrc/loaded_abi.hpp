// The binary interface of a run-time compiled model (pysharp.models.load_model).
//
// The model's library exports one function, pysharp_loaded_table(), whose Table holds
// the struct's field records (model_concept.hpp) and the model's own arithmetic: its
// loss_grad on a lane block and the derivatives seeded on it (models/derivatives.hpp),
// plus, for a square-loss model, its Jacobians and SGD. pysharp._core binds the Table
// once per precision (bind_loaded.cpp) and runs everything else itself: the batched
// drivers, Lanczos, the trajectory engine, SLQ and the dense Hessian are compiled once,
// in the core, for a model seen through its table, and call the library per lane
// block. A library then holds the model's arithmetic only, which is most of what a
// compile of a traced loss costs to build: no pybind11, no engine, no Lanczos.
// The generated translation unit is three lines,
//
//   #include "/path/to/the/users/model.hpp"
//   #include "loaded_abi.hpp"
//   PYSHARP_LOADED_LIBRARY(PhaseRetrieval, double)
//
// so that the compiler's diagnostics point at the user's file and line.
//
// The library is compiled with the core's compiler and flags against the core's headers
// (pysharp/models/_compiler.py keys its cache on them); the structs and lane blocks passed
// between the two by reference must still have one layout, which Sizes checks when _core
// opens a table (a core rebuilt from other headers refuses the library, and it is compiled
// again).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "cpu/sgd.hpp"
#include "model_concept.hpp"
#include "pysharp/core/lanes.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp::loaded {

using declared::FieldRecord;

// The version of Table's layout: a change to Table increments it.
inline constexpr int kAbiVersion = 3;

// The lane block the core's drivers hand a library: one vector register of Reals.
template <class Real>
using Block = Lanes<Real, kNativeLanes<Real>>;

// sizeof each type that crosses between _core and a library (a lane block and its mask
// differ between instruction sets).
struct Sizes {
  std::size_t real, block, block_mask, sgd_config, field_record;
};

template <class Real>
constexpr Sizes sizes_of() {
  return {sizeof(Real), sizeof(Block<Real>), sizeof(mask_t<Block<Real>>), sizeof(SGDConfig),
          sizeof(FieldRecord)};
}

inline bool operator==(const Sizes& a, const Sizes& b) {
  return a.real == b.real && a.block == b.block && a.block_mask == b.block_mask &&
         a.sgd_config == b.sgd_config && a.field_record == b.field_record;
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
  // the model's arithmetic on one lane block (V = Block<Real>): its loss_grad, hvp and
  // third_contraction (models/derivatives.hpp), called by the core's drivers
  mask_t<Block<Real>> (*block_loss_grad)(const void* model, const Block<Real>* w,
                                         Block<Real>* loss, Block<Real>* g, Block<Real>* work);
  mask_t<Block<Real>> (*block_hvp)(const void* model, const Block<Real>* w,
                                   const Block<Real>* v, Block<Real>* out,
                                   Jet<Block<Real>, 1>* scratch);
  mask_t<Block<Real>> (*block_third)(const void* model, const Block<Real>* w,
                                     const Block<Real>* v, Block<Real>* out,
                                     Jet<Block<Real>, 2>* scratch);
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
  using V = Block<Real>;
  static mask_t<V> block_loss_grad(const void* p, const V* w, V* loss, V* g, V* work) {
    return m(p).loss_grad(w, loss, g, work);
  }
  static mask_t<V> block_hvp(const void* p, const V* w, const V* v, V* out, Jet<V, 1>* s) {
    return ::pysharp::hvp(m(p), w, v, out, s);
  }
  static mask_t<V> block_third(const void* p, const V* w, const V* v, V* out, Jet<V, 2>* s) {
    return ::pysharp::third_contraction(m(p), w, v, out, s);
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
// jacobian()) gets the SGD tools; the core runs the engine of the scale-invariant runs
// (sphere, projections, EoS tracking) for the others only, as for the built-ins.
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
    t.block_loss_grad = E::block_loss_grad;
    t.block_hvp = E::block_hvp;
    t.block_third = E::block_third;
    if constexpr (declared::is_square_loss<Model, Real>()) {
      t.square_loss = true;
      t.n_samples = E::n_samples;
      t.input_dim = E::input_dim;
      t.sgd_min_batch = E::sgd_min_batch;
      t.jacobians = E::jacobians;
      t.sgd = E::sgd;
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
