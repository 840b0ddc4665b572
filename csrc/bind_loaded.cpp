// pysharp._core's side of a run-time compiled model (loaded_abi.hpp): the table its
// library exports, bound once per precision. A LoadedCore holds the model's struct, filled
// from its field records as a built-in's is (bind_declared.hpp). TableModel is a model to
// the core's CPU code (model.hpp's concept) whose arithmetic is the library's: the batched
// kernels, the dense Hessian, Lanczos, SLQ and the trajectory engine are instantiated here
// once, for TableModel, and call the library per lane block; the Jacobians and SGD of a
// square-loss model are the library's own.
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bind_declared.hpp"
#include "cpu/bind_square_loss.hpp"
#include "cpu/bn_linreg_rows.hpp"
#include "cpu/engine.hpp"
#include "cpu/slq.hpp"
#include "holders.hpp"
#include "loaded_abi.hpp"

namespace pysharp::loaded {

namespace py = pybind11;
using module::carray;
using module::require;

// Refuses, by name, what a model of its kind (square loss or not) does not have: the table
// holds the sample counts, Jacobians and SGD of a square-loss model only, and the core runs
// Lanczos and the trajectory engine for the others only.
template <class Real>
void require_kind(const Table<Real>& t, bool square_loss, const char* what) {
  require(t.square_loss == square_loss,
          std::string("this model has no ") + what +
              ": Lanczos and the trajectory engine are for scale-invariant models, the "
              "Jacobians and SGD for square-loss ones");
}

// The loaded model as the core's CPU code sees a model: dim, work size and groups read
// from the table once, loss_grad on the one lane block the library was compiled for.
template <class Real>
struct TableModel {
  const Table<Real>* table = nullptr;
  const void* address = nullptr;
  int dim_ = 0, work_size_ = 0;
  std::vector<int> bounds;  // group_begin(k), k = 0..G
  int dim() const { return dim_; }
  int work_size() const { return work_size_; }
  int n_groups() const { return static_cast<int>(bounds.size()) - 1; }
  int group_begin(int k) const { return bounds[k]; }
  int n_samples() const {
    require_kind(*table, true, "training samples");
    return table->n_samples(address);
  }
  int input_dim() const {
    require_kind(*table, true, "input dimension");
    return table->input_dim(address);
  }
  template <class S>
  mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const {
    static_assert(std::is_same_v<S, Block<Real>>,
                  "a loaded model's library evaluates lane blocks only; the derivatives go "
                  "through hvp() and third_contraction() below");
    return table->block_loss_grad(address, w, loss, g, work);
  }
};

// models/derivatives.hpp's hvp and third_contraction, for a TableModel: the library's,
// which seed the model's own loss_grad (chosen over the generic templates by overload
// resolution, found by argument-dependent lookup where the drivers call them).
template <class Real>
mask_t<Block<Real>> hvp(const TableModel<Real>& m, const Block<Real>* w, const Block<Real>* v,
                        Block<Real>* out, Jet<Block<Real>, 1>* scratch) {
  return m.table->block_hvp(m.address, w, v, out, scratch);
}
// The HVP at one point (the scalar Lanczos of k >= 2 eigenpairs): the point in every lane
// of a block, lane 0 read back. The library then holds no scalar instantiation of the
// model (a 948-equation RNN compiled in 22 s instead of 36), and this HVP has the bits of
// the block kernels' (lane arithmetic, core/lane_math.hpp), not those of a scalar path.
template <class Real>
bool hvp(const TableModel<Real>& m, const Real* w, const Real* v, Real* out, Jet<Real, 1>*) {
  using V = Block<Real>;
  const int D = m.dim();
  thread_local std::vector<V> points;
  thread_local std::vector<Jet<V, 1>> jets;
  points.resize(3 * static_cast<std::size_t>(D));
  jets.resize(jet_scratch_size(m));
  V* wb = points.data();
  V* vb = wb + D;
  V* ob = vb + D;
  for (int i = 0; i < D; ++i) {
    wb[i] = V(w[i]);
    vb[i] = V(v[i]);
  }
  const mask_t<V> defined = m.table->block_hvp(m.address, wb, vb, ob, jets.data());
  for (int i = 0; i < D; ++i) out[i] = lane(ob[i], 0);
  return lane(defined, 0);
}
template <class Real>
mask_t<Block<Real>> third_contraction(const TableModel<Real>& m, const Block<Real>* w,
                                      const Block<Real>* v, Block<Real>* out,
                                      Jet<Block<Real>, 2>* scratch) {
  return m.table->block_third(m.address, w, v, out, scratch);
}

template <class Real>
int sgd_min_batch(const TableModel<Real>& m) {
  require_kind(*m.table, true, "SGD");
  return m.table->sgd_min_batch(m.address);
}

// A library's table, checked to be one this core can run.
template <class Real>
const Table<Real>* open_table(std::uintptr_t address) {
  require(address != 0, "the library returned no table");
  const auto* t = reinterpret_cast<const Table<Real>*>(address);
  require(t->abi_version == kAbiVersion && t->sizes == sizes_of<Real>(),
          std::string("the model's library was compiled against other pysharp headers than "
                      "this pysharp._core (its table's version or layout differs): rebuild "
                      "pysharp, or delete the library from the model cache to compile it "
                      "again"));
  return t;
}

// The model's struct, built by the library and filled from a dict of its fields.
template <class Real>
struct LoadedCore {
  struct Free {
    std::size_t align;
    void (*destroy)(void*);  // set once the library has built the struct
    void operator()(void* p) const {
      if (destroy) destroy(p);
      ::operator delete(p, std::align_val_t(align));
    }
  };
  std::vector<py::object> keep;
  std::unique_ptr<void, Free> storage;
  TableModel<Real> model;

  LoadedCore(const Table<Real>* t, const py::dict& data)
      : storage(::operator new(t->model_size, std::align_val_t(t->model_align)),
                Free{t->model_align, nullptr}) {
    t->construct(storage.get());
    storage.get_deleter().destroy = t->destroy;
    const std::vector<FieldRecord> fields(t->fields, t->fields + t->n_fields);
    declared::bind_fields(fields, static_cast<char*>(storage.get()), data, keep);
    const void* p = storage.get();
    model.table = t;
    model.address = p;
    model.dim_ = t->dim(p);
    model.work_size_ = t->work_size(p);
    require(model.dim_ >= 1, "the model's dim() must be >= 1 for this data");
    require(model.work_size_ >= 0, "the model's work_size() must be >= 0");
    model.bounds = declared::checked_group_bounds(model.dim_, t->n_groups(p),
                                                  t->declares_group_begin,
                                                  [&](int k) { return t->group_begin(p, k); });
  }
  LoadedCore(const LoadedCore&) = delete;
};

// The struct's address for pysharp.jax's FFI handlers (bind_model.hpp's model_address).
template <class Real>
std::uintptr_t model_address(const LoadedCore<Real>& c) {
  return reinterpret_cast<std::uintptr_t>(c.model.address);
}

// bind_model.hpp's executor for a LoadedCore: the core's CPU code on its TableModel, and
// the library's Jacobians and SGD. What a model of its kind does not have (the engine of a
// square-loss model, the SGD tools of a scale-invariant one) is refused with a message.
struct TableExec {
  // c's model where its kind (square loss or not) has `what`, else refused by name.
  template <class Real>
  static const TableModel<Real>& of_kind(const LoadedCore<Real>& c, bool square_loss,
                                         const char* what) {
    require_kind(*c.model.table, square_loss, what);
    return c.model;
  }
  template <class Real>
  static void loss_grad(const LoadedCore<Real>& c, const Real* W, std::int64_t B, Real* loss,
                        Real* G, std::uint8_t* ok) {
    cpu::loss_grad(c.model, W, B, loss, G, ok);
  }
  template <int N, class Real>
  static void directional(const LoadedCore<Real>& c, const Real* W, const Real* V,
                          std::int64_t B, Real* out, std::uint8_t* ok) {
    cpu::directional<N>(c.model, W, V, B, out, ok);
  }
  template <class Real>
  static void hessian(const LoadedCore<Real>& c, const Real* W, std::int64_t B, Real* H,
                      std::uint8_t* ok) {
    cpu::hessian(c.model, W, B, H, ok);
  }
  template <class Real>
  static void lanczos(const LoadedCore<Real>& c, const LanczosOptions& o, const Real* W,
                      const Real* start, const std::uint64_t* streams, std::int64_t B,
                      Real* evals, Real* evecs, Real* resid, int* iterations,
                      std::uint8_t* converged, std::uint8_t* ok) {
    cpu::lanczos_batch(of_kind(c, false, "lanczos"), o, W, start, streams, B, evals, evecs,
                       resid, iterations, converged, ok);
  }
  template <class Real>
  static void run(const LoadedCore<Real>& c, const EngineConfig& cfg, bool, const Real* W0,
                  const Hyperparameters<Real>& h, std::int64_t B, long long offset,
                  module::RunOutputs<Real>& out) {
    cpu::run_batch(of_kind(c, false, "run"), cfg, W0, h, B, offset, out.host_records());
  }
  static void slq(const LoadedCore<double>& c, const double* W, std::int64_t B, int P,
                  int steps, std::uint64_t seed, double* alpha, double* beta, double* nodes,
                  double* weights, int* count, std::uint8_t* ok) {
    cpu::slq_batch(c.model, W, B, P, steps, seed, alpha, beta, nodes, weights, count, ok);
  }
  template <class Real>
  static void jacobians(const LoadedCore<Real>& c, const Real* W, std::int64_t P, Real* F,
                        Real* A, Real* GX) {
    const TableModel<Real>& m = of_kind(c, true, "jacobians");
    m.table->jacobians(m.address, W, P, F, A, GX);
  }
  template <class Real>
  static void sgd(const LoadedCore<Real>& c, const SGDConfig& cfg, Real* W, const Real* lr,
                  const int* batch, const Real* wd, std::int64_t T, std::int64_t offset,
                  Real* loss, std::uint8_t* diverged, long long* diverged_step) {
    const TableModel<Real>& m = of_kind(c, true, "sgd");
    m.table->sgd(m.address, cfg, W, lr, batch, wd, T, offset, loss, diverged, diverged_step);
  }
};

// A library as pysharp/models/_compiler.py hands it to pysharp/models/_loaded.py: what
// a model's own Python module offered when each model compiled one.
template <class Real>
struct Library {
  const Table<Real>* table;
};

template <class Real>
void bind_precision(py::module_& m, const std::string& suffix) {
  using Core = LoadedCore<Real>;
  // what a table's `sizes` must hold, in Sizes' order (tests write tables by hand)
  const Sizes z = sizes_of<Real>();
  m.attr(("LOADED_ABI_SIZES" + suffix).c_str()) =
      py::make_tuple(z.real, z.block, z.block_mask, z.sgd_config, z.field_record);
  py::class_<Core> core(m, ("LoadedCore" + suffix).c_str(),
                        "A run-time compiled model's struct, filled from its fields");
  core.def_property_readonly("n_groups", [](const Core& c) { return c.model.n_groups(); });
  core.def_property_readonly("group_bounds",
                             [](const Core& c) { return py::cast(c.model.bounds); });
  core.def_property_readonly("_layout", [](const Core& c) {
    const Table<Real>& t = *c.model.table;
    return declared::layout(std::vector<FieldRecord>(t.fields, t.fields + t.n_fields),
                            c.model.address, t.model_size, t.model_align, c.model.work_size_);
  });
  module::bind_kernels<TableExec, Core, Real>(core);

  py::class_<Library<Real>> lib(m, ("LoadedLibrary" + suffix).c_str(),
                                "The table of a run-time compiled model (loaded_abi.hpp)");
  lib.def(py::init([](std::uintptr_t address) {
            return Library<Real>{open_table<Real>(address)};
          }),
          py::arg("address"), "From the address pysharp_loaded_table() returned");
  lib.def_property_readonly("KIND", [](const Library<Real>& l) {
    return l.table->square_loss ? "square_loss" : "scale_invariant";
  });
  lib.def_property_readonly("MODEL_NAME",
                            [](const Library<Real>& l) { return l.table->model_name; });
  lib.def_property_readonly("DTYPE", [](const Library<Real>&) {
    return sizeof(Real) == 8 ? "float64" : "float32";
  });
  lib.def_property_readonly("FIELDS", [](const Library<Real>& l) {
    return declared::describe({l.table->fields, l.table->fields + l.table->n_fields});
  });
  lib.def(
      "Model",
      [](const Library<Real>& l, const py::dict& data) {
        return std::make_unique<Core>(l.table, data);
      },
      py::arg("data"), py::keep_alive<0, 1>(), "The model's struct bound to `data` {field: value}");
  module::bind_engine<TableExec, Core, Real>(core);
  module::add_square_loss<TableExec, Core, Real>(core);
  if constexpr (std::is_same_v<Real, double>) module::def_slq<TableExec, Core>(m);
}

}  // namespace pysharp::loaded

namespace pysharp::module {

void bind_loaded(py::module_& m) {
  m.attr("LOADED_ABI_VERSION") = loaded::kAbiVersion;
  loaded::bind_precision<double>(m, "_f64");
  loaded::bind_precision<float>(m, "_f32");
}

}  // namespace pysharp::module
