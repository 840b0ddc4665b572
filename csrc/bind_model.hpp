// The Python interface of a model class, written once for pysharp._core and
// pysharp._cuda: argument checks, result arrays and their names, the GIL. What
// runs the computation is an executor: CpuExec (cpu/bind_cpu.hpp, OpenMP over lane
// blocks) or CudaExec (cuda/executor.cuh, device copies and kernel launches), each
// with the same static functions on host pointers:
//
//   loss_grad(core, W, B, loss, G, ok)
//   directional<N>(core, W, V, B, out, ok)         N = 1: H v, N = 2: D^3L[v, v]
//   hessian(core, W, B, H, ok)
//   lanczos(core, options, W, start, B, evals, evecs, resid, iterations, converged, ok)
//   run(core, config, reduced, W0, lr, wd, B, offset, RunOutputs&)
//
// Engine and Lanczos options arrive as dicts read by field name
// (module_options.hpp; pysharp/_engine/__init__.py builds them).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "module_options.hpp"
#include "cpu/threads.hpp"

namespace pysharp::module {

namespace py = pybind11;

template <class T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;
using flags = py::array_t<std::uint8_t>;

// A holder with a `spectral` member has BN linear regression's exact reduced update.
template <class Core, class = void>
struct has_reduced : std::false_type {};
template <class Core>
struct has_reduced<Core, std::void_t<decltype(std::declval<const Core&>().spectral)>>
    : std::true_type {};

template <class Core>
std::int64_t checked_batch(const Core& core, const py::array& W, const char* name) {
  require(W.ndim() == 2 && W.shape(1) == core.model.dim(),
          std::string(name) + " must be (B, " + std::to_string(core.model.dim()) + ")");
  return W.shape(0);
}

// The address of the model struct a holder views (a loaded model's holder keeps it
// elsewhere and overloads this, bind_loaded.cpp).
template <class Core>
std::uintptr_t model_address(const Core& c) {
  return reinterpret_cast<std::uintptr_t>(&c.model);
}

// A run's hyperparameters from {name: (B,) array}: exactly the fields `method` reads
// (kMethodHyper), each with one entry per trajectory; `held` keeps the arrays alive.
template <class Real>
Hyperparameters<Real> hyperparameters_from(const py::dict& d, Method method, std::int64_t B,
                                           std::array<carray<Real>, kHyperparameterCount>& held) {
  const int m = static_cast<int>(method);
  Fields f(d, std::string("the hyperparameters of method ") + kMethodNames[m]);
  Hyperparameters<Real> h;
  for (int i = 0; i < kHyperparameterCount; ++i) {
    if (!(kMethodHyper[m] & (1u << i))) continue;
    const char* name = kHyperparameterNames[i];
    held[i] = f.get<carray<Real>>(name);
    require(held[i].ndim() == 1 && held[i].size() == B,
            std::string(name) + " must have one entry per trajectory");
    h.field(i) = held[i].data();
  }
  f.done();
  return h;
}

// The host arrays a `run` returns, one per record of engine/records.hpp in its order, and
// the BatchRecords that write them.
template <class Real>
struct RunOutputs {
  static constexpr int kArrays = kRecordCount;
  std::array<py::array, kArrays> a;
  int groups, top_k;

  RunOutputs(py::ssize_t B, py::ssize_t D, int G, const EngineConfig& c)
      : groups(G), top_k(top_k_of(c)) {
    const auto s = shapes(B, D, G, c);
    int i = 0;
#define PYSHARP_RECORD_ARRAY(name, field, T, every, item, when) \
  a[i] = carray<T>(s[i]);                                       \
  ++i;
    PYSHARP_RECORDS(PYSHARP_RECORD_ARRAY)
#undef PYSHARP_RECORD_ARRAY
  }

  // The top-k eigenvalues a run records: top_k, or 0 where it asks for none (top_k < 2).
  static int top_k_of(const EngineConfig& c) { return c.top_k >= 2 ? c.top_k : 0; }

  // Each record's shape, in the table's order; an output not asked for is empty: no rows.
  static std::array<std::vector<py::ssize_t>, kArrays> shapes(py::ssize_t B, py::ssize_t D,
                                                              int G, const EngineConfig& c) {
    const int k = top_k_of(c);
    const py::ssize_t rows[] = {0, n_records(c.steps, c.record_every),  // by RecordEvery
                                n_records(c.steps, c.sharpness_every),
                                n_records(c.steps, c.theta_every)};
    const py::ssize_t size[] = {1, D, G, k ? k : 1};                  // by RecordItem
    const bool on[] = {true, c.sharpness_every > 0, G > 1, k > 0};    // by RecordWhen
    std::array<std::vector<py::ssize_t>, kArrays> out;
    for (int i = 0; i < kArrays; ++i) {
      const RecordSpec& r = kRecords[i];
      if (r.every != RecordEvery::none)
        out[i].push_back(on[static_cast<int>(r.when)] ? rows[static_cast<int>(r.every)] : 0);
      out[i].push_back(B);
      if (r.item != RecordItem::none) out[i].push_back(size[static_cast<int>(r.item)]);
    }
    return out;
  }

  // Whether the result dict holds record i: those of groups and of top_k only where they
  // were asked for.
  static bool present(int i, int groups, int top_k) {
    const bool when[] = {true, true, groups > 1, top_k >= 2};  // by RecordWhen
    return when[static_cast<int>(kRecords[i].when)];
  }

  std::array<py::array*, kArrays> arrays() {
    std::array<py::array*, kArrays> p;
    for (int i = 0; i < kArrays; ++i) p[i] = &a[i];
    return p;
  }

  // Records writing to p[i] for arrays()[i]: the host data, or a device mirror.
  // An empty array (an output not asked for) gets a null pointer.
  BatchRecords<Real> records(const std::array<void*, kArrays>& p) const {
    BatchRecords<Real> r;
    int i = 0;
#define PYSHARP_RECORD_POINTER(name, field, T, every, item, when) \
  r.field = static_cast<T*>(p[i++]);
    PYSHARP_RECORDS(PYSHARP_RECORD_POINTER)
#undef PYSHARP_RECORD_POINTER
    r.groups = groups;
    r.top_k = top_k;
    return r;
  }

  BatchRecords<Real> host_records() {
    std::array<void*, kArrays> p{};
    for (int i = 0; i < kArrays; ++i) p[i] = a[i].size() ? a[i].mutable_data() : nullptr;
    return records(p);
  }

  // The result dict: the records of groups and of top_k only where they were asked for.
  py::dict to_dict() const {
    py::dict r;
    for (int i = 0; i < kArrays; ++i)
      if (present(i, groups, top_k)) r[kRecords[i].name] = a[i];
    return r;
  }
};

// A record's element type in the record table's spelling.
template <class T, class Real>
constexpr const char* record_dtype() {
  static_assert(std::is_same_v<T, Real> || std::is_same_v<T, std::uint8_t> ||
                    std::is_same_v<T, long long>,
                "a record holds Real, std::uint8_t or long long");
  return std::is_same_v<T, Real> ? "real" : std::is_same_v<T, std::uint8_t> ? "u8" : "i64";
}

// The record table this module was compiled with: (name, field, dtype, every, item, when)
// per record, in pysharp._engine.records.RECORDS' spelling.
template <class Real>
py::tuple record_table() {
  py::list rows;
#define PYSHARP_RECORD_TUPLE(name, field, T, every, item, when)                        \
  rows.append(py::make_tuple(#name, #field, record_dtype<T, Real>(),                  \
                             kRecordEveryNames[static_cast<int>(RecordEvery::every)], \
                             kRecordItemNames[static_cast<int>(RecordItem::item)],    \
                             kRecordWhenNames[static_cast<int>(RecordWhen::when)]));
  PYSHARP_RECORDS(PYSHARP_RECORD_TUPLE)
#undef PYSHARP_RECORD_TUPLE
  return py::tuple(rows);
}

// dim, loss_grad, hvp, third, hessian.
template <class Exec, class Core, class Real>
void bind_kernels(py::class_<Core>& cls) {
  cls.def_property_readonly("dim", [](const Core& c) { return c.model.dim(); });
  cls.def_property_readonly(
      "model_address",
      [](const Core& c) { return model_address(c); },
      "Address of the model's view, valid while this object lives: what pysharp.jax's FFI "
      "handlers (cpu/jax_ffi.hpp) read");
  cls.def(
      "loss_grad",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t B = checked_batch(c, W, "W");
        carray<Real> loss(B), G({B, static_cast<std::int64_t>(c.model.dim())});
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::loss_grad(c, W.data(), B, loss.mutable_data(), G.mutable_data(),
                          ok.mutable_data());
        }
        return py::make_tuple(loss, G, ok);
      },
      py::arg("W"), "(B, D) -> (loss (B,), grad (B, D), ok (B,) uint8)");
  auto directional = [](auto order) {
    return [](const Core& c, const carray<Real>& W, const carray<Real>& V) {
      const std::int64_t B = checked_batch(c, W, "W");
      require(checked_batch(c, V, "V") == B, "W and V must have the same shape");
      carray<Real> out({B, static_cast<std::int64_t>(c.model.dim())});
      flags ok(B);
      {
        py::gil_scoped_release nogil;
        const pysharp::cpu::CoreShare cores;
        Exec::template directional<decltype(order)::value>(c, W.data(), V.data(), B,
                                                           out.mutable_data(), ok.mutable_data());
      }
      return py::make_tuple(out, ok);
    };
  };
  cls.def("hvp", directional(std::integral_constant<int, 1>{}), py::arg("W"), py::arg("V"),
          "(B, D), (B, D) -> (H v (B, D), ok (B,))");
  cls.def("third", directional(std::integral_constant<int, 2>{}), py::arg("W"), py::arg("V"),
          "(B, D), (B, D) -> (D^3L[v, v] (B, D), ok (B,))");
  cls.def(
      "hessian",
      [](const Core& c, const carray<Real>& W) {
        const std::int64_t B = checked_batch(c, W, "W");
        const std::int64_t D = c.model.dim();
        carray<Real> H({B, D, D});
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::hessian(c, W.data(), B, H.mutable_data(), ok.mutable_data());
        }
        return py::make_tuple(H, ok);
      },
      py::arg("W"), "(B, D) -> (H (B, D, D), ok (B,))");
}

// lanczos and run: the Hessian's extreme eigenpairs and the trajectory engine.
template <class Exec, class Core, class Real>
void bind_engine(py::class_<Core>& cls) {
  cls.def(
      "lanczos",
      [](const Core& c, const carray<Real>& W, const py::dict& options,
         std::optional<carray<Real>> start, std::optional<carray<std::uint64_t>> streams,
         std::uint64_t counter) {
        const std::int64_t B = checked_batch(c, W, "W");
        const int D = c.model.dim();
        LanczosOptions o = lanczos_options_from(options, D);
        o.counter = counter;
        if (start) require(checked_batch(c, *start, "start") == B, "start must match W");
        if (streams)
          require(streams->ndim() == 1 && streams->shape(0) == B, "streams must be (B,)");
        const py::ssize_t k = o.k;
        carray<Real> evals({(py::ssize_t)B, k}), evecs({(py::ssize_t)B, k, (py::ssize_t)D}),
            resid({(py::ssize_t)B, k});
        py::array_t<int> iters(B);
        flags conv(B), ok(B);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::lanczos(c, o, W.data(), start ? start->data() : nullptr,
                        streams ? streams->data() : nullptr, B, evals.mutable_data(),
                        evecs.mutable_data(), resid.mutable_data(), iters.mutable_data(),
                        conv.mutable_data(), ok.mutable_data());
        }
        return py::make_tuple(evals, evecs, resid, iters, conv, ok);
      },
      py::arg("W"), py::arg("options"), py::arg("start") = py::none(),
      py::arg("streams") = py::none(), py::arg("counter") = 0,
      "(B, D), LanczosOptions dict -> (evals (B, k), evecs (B, k, D), resid (B, k), "
      "iterations (B,), converged (B,), ok (B,)); row b's random start keyed by (seed, "
      "streams[b] (default b), counter), as the engine keys a trajectory's at a step");
  cls.def(
      "run",
      [](const Core& c, const carray<Real>& W0, const py::dict& hyper, const py::dict& config,
         long long offset) {
        const std::int64_t B = checked_batch(c, W0, "w0");
        const int D = c.model.dim();
        require(offset >= 0, "offset must be >= 0");
        bool reduced = false;
        const EngineConfig cfg = engine_config_from(config, D, has_reduced<Core>::value, &reduced);
        std::array<carray<Real>, kHyperparameterCount> held;  // alive until the run ends
        const Hyperparameters<Real> h = hyperparameters_from(hyper, cfg.method, B, held);
        RunOutputs<Real> out(B, D, n_groups(c.model), cfg);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          Exec::run(c, cfg, reduced, W0.data(), h, B, offset, out);
        }
        return out.to_dict();
      },
      py::arg("w0"), py::arg("hyper"), py::arg("config"), py::arg("offset") = 0,
      "(B, D), {name: (B,)} the method's hyperparameters, EngineConfig dict, first "
      "trajectory index -> dict of records");
  cls.def(
      "plan",
      [](const Core& c, std::int64_t B, std::optional<py::dict> config,
         std::optional<py::dict> lanczos) {
        using Model = std::decay_t<decltype(c.model)>;
        require(B >= 0, "B must be >= 0");
        const int D = c.model.dim(), G = n_groups(c.model);
        py::dict p;
        p["dim"] = D;
        p["groups"] = G;
        p["work_size"] = c.model.work_size();
        p["state_reals"] = FullSpaceState<Model, Real>::scratch_size(c.model);
        p["jets"] = jet_scratch_size(c.model);
        if (config) {
          bool reduced = false;
          const EngineConfig cfg = engine_config_from(*config, D, has_reduced<Core>::value,
                                                      &reduced);
          const auto shapes = RunOutputs<Real>::shapes(B, D, G, cfg);
          const int top_k = RunOutputs<Real>::top_k_of(cfg);
          py::dict outputs;
          py::list names;
          int i = 0;
#define PYSHARP_RECORD_PLAN(name, field, T, every, item, when)                         \
  outputs[#name] = py::make_tuple(py::tuple(py::cast(shapes[i])), py::dtype::of<T>()); \
  if (RunOutputs<Real>::present(i, G, top_k)) names.append(#name);                    \
  ++i;
          PYSHARP_RECORDS(PYSHARP_RECORD_PLAN)
#undef PYSHARP_RECORD_PLAN
          p["outputs"] = outputs;
          p["result_names"] = names;
          p["top_k"] = top_k;
          p["trajectory_reals"] = trajectory_scratch_reals(D, cfg);
        }
        if (lanczos) p["lanczos_reals"] = lanczos_scratch_size(D, lanczos_options_from(*lanczos, D));
        return p;
      },
      py::arg("B"), py::arg("config") = py::none(), py::arg("lanczos") = py::none(),
      "What a run of B trajectories allocates, for an engine that launches this core's "
      "kernels itself (the CuPy backend): dim, groups, work_size, state_reals (one "
      "trajectory's state), jets (one derivative evaluation's, per order + 1); with an "
      "EngineConfig dict, outputs {record: (shape, dtype)} in the table's order, "
      "result_names (the keys run returns, in order), top_k and trajectory_reals (one "
      "trajectory's engine scratch, one trajectory a thread); with LanczosOptions, "
      "lanczos_reals (one solve's scratch)");
}

template <class Exec, class Core, class Real>
void bind_model(py::class_<Core>& cls) {
  bind_kernels<Exec, Core, Real>(cls);
  bind_engine<Exec, Core, Real>(cls);
}

// The constructors of the model classes. _core's holders keep host arrays and
// _cuda's device copies, but both take these arguments, which pysharp/models/
// passes by name: one list per model, so the untested-in-CI GPU module cannot
// drift from the CPU one.
template <class Real, class Core>
void def_init_BNLinearRegression(py::class_<Core>& cls) {
  cls.def(py::init<const carray<Real>&, const carray<Real>&, double, const carray<Real>&,
                   const carray<Real>&, const carray<Real>&, double>(),
          py::arg("Xc"), py::arg("u"), py::arg("scale"), py::arg("sigma"), py::arg("ut"),
          py::arg("V"), py::arg("uperp2"));
}
// A holder constructible from a dict of its fields (DeclaredCore, bind_declared.hpp:
// _core's Toy3D, BNTwoLayerNet, BNMatrixCompletion) gets them by name from the same
// arguments: the fields derived from them (norms, scales) are computed here, once, as the
// dedicated holders of _cuda compute them. Arrays are copied: the model keeps its own.
template <class Core>
constexpr bool kFromFields = std::is_constructible_v<Core, const py::dict&>;

template <class Real, class Core>
void def_init_BNMatrixCompletion(py::class_<Core>& cls) {
  if constexpr (kFromFields<Core>) {
    cls.def(py::init([](const carray<int>& rows, const carray<int>& cols, const carray<Real>& u,
                        double scale, int m1, int m2, int rank) {
              require(rows.ndim() == 1 && rows.size() == u.size() && cols.size() == u.size(),
                      "rows, cols and u must have one entry per observation");
              for (py::ssize_t k = 0; k < rows.size(); ++k)
                require(rows.data()[k] >= 0 && rows.data()[k] < m1 && cols.data()[k] >= 0 &&
                            cols.data()[k] < m2,
                        "observation index out of range");
              py::dict f;
              f["rows"] = rows.attr("copy")();
              f["cols"] = cols.attr("copy")();
              f["u"] = u.attr("copy")();
              f["scale"] = scale;
              f["m1"] = m1;
              f["m2"] = m2;
              f["r"] = rank;
              return new Core(f);
            }),
            py::arg("rows"), py::arg("cols"), py::arg("u"), py::arg("scale"), py::arg("m1"),
            py::arg("m2"), py::arg("rank"));
  } else {
    cls.def(py::init<const carray<int>&, const carray<int>&, const carray<Real>&, double, int,
                     int, int>(),
            py::arg("rows"), py::arg("cols"), py::arg("u"), py::arg("scale"), py::arg("m1"),
            py::arg("m2"), py::arg("rank"));
  }
}
template <class Real, class Core>
void def_init_BNTwoLayerNet(py::class_<Core>& cls) {
  if constexpr (kFromFields<Core>) {
    cls.def(py::init([](const carray<Real>& Xc, const carray<Real>& y, int width,
                        int activation) {
              require(width >= 1 && (activation == 0 || activation == 1),
                      "width must be >= 1 and activation 0 (tanh) or 1 (relu)");
              double fro2 = 0;  // ||Xc||_F^2, summed in double as the model's floor expects
              for (py::ssize_t i = 0; i < Xc.size(); ++i)
                fro2 += double(Xc.data()[i]) * double(Xc.data()[i]);
              py::dict f;
              f["Xc"] = Xc.attr("copy")();
              f["y"] = y.attr("copy")();
              f["xc_fro2"] = fro2;
              f["inv_sqrt_m"] = 1 / std::sqrt(double(width));
              f["m"] = width;
              f["act"] = activation;
              return new Core(f);
            }),
            py::arg("Xc"), py::arg("y"), py::arg("width"), py::arg("activation"));
  } else {
    cls.def(py::init<const carray<Real>&, const carray<Real>&, int, int>(), py::arg("Xc"),
            py::arg("y"), py::arg("width"), py::arg("activation"));
  }
}
template <class Real, class Core>
void def_init_Toy3D(py::class_<Core>& cls) {
  if constexpr (kFromFields<Core>) {
    cls.def(py::init([](double c) {
              py::dict f;
              f["c"] = c;
              return new Core(f);
            }),
            py::arg("c"));
  } else {
    cls.def(py::init<double>(), py::arg("c"));
  }
}

}  // namespace pysharp::module
