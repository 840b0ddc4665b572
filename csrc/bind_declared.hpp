// A model declared with PYSHARP_MODEL (pysharp/model.hpp) held and bound by
// its fields' names: the one door through which run-time compiled models
// (pysharp.models.load_model) reach every tool, and the holder of the built-in
// models of pysharp._core that need no more than their fields (csrc/holders.hpp).
//
// The generated translation unit of a loaded model is three lines:
//
//   #include "/path/to/the/users/model.hpp"
//   #include "bind_declared.hpp"
//   PYSHARP_LOADED_MODULE(_pysharp_model_<key>, PhaseRetrieval, double)
//
// so that the compiler's diagnostics point at the user's file and line.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/bind_cpu.hpp"
#include "cpu/bind_square_loss.hpp"
#include "pysharp/model.hpp"

namespace pysharp::declared {

namespace py = pybind11;
using module::require;

// -- the model concept, checked with messages that name the missing member --
template <class M, class = void>
struct has_dim : std::false_type {};
template <class M>
struct has_dim<M, std::void_t<decltype(int(std::declval<const M&>().dim()))>> : std::true_type {};
template <class M, class = void>
struct has_work_size : std::false_type {};
template <class M>
struct has_work_size<M, std::void_t<decltype(int(std::declval<const M&>().work_size()))>>
    : std::true_type {};
template <class M, class S, class = void>
struct has_loss_grad : std::false_type {};
template <class M, class S>
struct has_loss_grad<M, S,
                     std::void_t<decltype(bool(std::declval<const M&>().loss_grad(
                         std::declval<const S*>(), std::declval<S*>(), std::declval<S*>(),
                         std::declval<S*>())))>> : std::true_type {};
template <class M, class = void>
struct has_fields : std::false_type {};
struct NoVisitor {
  template <class T>
  void array(const char*, const T&, std::initializer_list<Extent>) {}
  template <class T>
  void scalar(const char*, const T&) {}
};
template <class M>
struct has_fields<M, std::void_t<decltype(pysharp_fields(std::declval<M&>(),
                                                         std::declval<NoVisitor&>()))>>
    : std::true_type {};

// A square-loss model (models/square_loss.hpp) is recognised by its jacobian(); the
// rest of that contract is then required member by member.
template <class M, class Real, class = void>
struct has_jacobian : std::false_type {};
template <class M, class Real>
struct has_jacobian<M, Real,
                    std::void_t<decltype(std::declval<const M&>().jacobian(
                        std::declval<const Real*>(), std::declval<const Real*>(),
                        std::declval<Real*>(), std::declval<Real*>(), std::declval<Real*>(),
                        std::declval<Real*>()))>> : std::true_type {};
template <class M, class Real, class = void>
struct has_sample : std::false_type {};
template <class M, class Real>
struct has_sample<M, Real,
                  std::void_t<decltype(std::declval<const M&>().sample(
                      std::declval<const Real*>(), std::declval<const Real*>(), Real(), Real(),
                      std::declval<Real*>(), std::declval<Real*>()))>> : std::true_type {};
template <class M, class = void>
struct has_sizes : std::false_type {};
template <class M>
struct has_sizes<M, std::void_t<decltype(int(std::declval<const M&>().n_samples())),
                                decltype(int(std::declval<const M&>().input_dim()))>>
    : std::true_type {};
template <class M, class Real, class = void>
struct has_data_xy : std::false_type {};
template <class M, class Real>
struct has_data_xy<M, Real,
                   std::enable_if_t<std::is_convertible_v<decltype(std::declval<const M&>().X),
                                                          const Real*> &&
                                    std::is_convertible_v<decltype(std::declval<const M&>().y),
                                                          const Real*>>> : std::true_type {};

template <class M, class Real>
constexpr bool is_square_loss() {
  if constexpr (has_jacobian<M, Real>::value) {
    static_assert(has_sizes<M>::value,
                  "pysharp square-loss model (it has jacobian()): missing members "
                  "`PYSHARP_HD int n_samples() const` and `PYSHARP_HD int input_dim() const`");
    static_assert(has_data_xy<M, Real>::value,
                  "pysharp square-loss model (it has jacobian()): its data must be the members "
                  "`const Real* X` (n, d) and `const Real* y` (n,)");
    static_assert(has_sample<M, Real>::value,
                  "pysharp square-loss model (it has jacobian()): missing member `template "
                  "<class S, class X> PYSHARP_HD S sample(const S* w, const X* x, X y, X coeff, "
                  "S* g, S* work) const`");
    return true;
  }
  return false;
}

template <class M, class Real>
constexpr bool check_concept() {
  static_assert(std::is_default_constructible_v<M>,
                "pysharp model: the struct must be default-constructible (plain fields, no "
                "constructor taking arguments)");
  static_assert(has_fields<M>::value,
                "pysharp model: no PYSHARP_MODEL(Name, ...) declaration for this struct (put "
                "it after the struct, in the same namespace)");
  static_assert(has_dim<M>::value, "pysharp model: missing member `PYSHARP_HD int dim() const`");
  static_assert(has_work_size<M>::value,
                "pysharp model: missing member `PYSHARP_HD int work_size() const`");
  static_assert(has_loss_grad<M, Real>::value,
                "pysharp model: missing member `template <class S> PYSHARP_HD mask_t<S> "
                "loss_grad(const S* w, S* loss, S* g, S* work) const`");
  return true;
}

template <class T>
const char* scalar_kind() {
  if constexpr (std::is_floating_point_v<T>)
    return "float";
  else
    return "int";
}

// The fields as Python sees them: a list of dicts {name, kind, dtype, extents}.
struct Describer {
  py::list fields;
  template <class T>
  void array(const char* name, const T* const&, std::initializer_list<Extent> extents) {
    py::list axes;
    for (const Extent& e : extents) axes.append(e.name);
    py::dict f;
    f["name"] = name;
    f["kind"] = "array";
    f["dtype"] = py::str(py::dtype::of<T>());
    f["extents"] = axes;
    fields.append(f);
  }
  template <class T>
  void scalar(const char* name, const T&) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>,
                  "PYSHARP_SCALAR: the member must be a number or an enum");
    py::dict f;
    f["name"] = name;
    f["kind"] = "scalar";
    if constexpr (std::is_enum_v<T>)
      f["dtype"] = "int";
    else
      f["dtype"] = scalar_kind<T>();
    f["extents"] = py::list();
    fields.append(f);
  }
};

// Where each array field's pointer sits in the struct (byte offsets), for a device copy
// of the struct whose pointers name device arrays (pysharp/_backends/_cupy.py).
struct Layout {
  const char* base;
  py::list arrays;
  template <class T>
  void array(const char* name, T* const& field, std::initializer_list<Extent>) {
    arrays.append(py::make_tuple(name, reinterpret_cast<const char*>(&field) - base));
  }
  template <class T>
  void scalar(const char*, const T&) {}
};

// Fills a model from a dict of NumPy arrays and numbers (validated and converted
// by pysharp/models/_loaded.py, or by a built-in's constructor in bind_model.hpp;
// the checks here guard a direct call).
// Scalars first, then arrays, so an int scalar may also be an extent.
struct Binder {
  const py::dict& data;
  std::vector<py::object>& keep;
  bool arrays_pass = false;
  std::map<const int*, std::string> set_by;  // extent -> the field that fixed it

  template <class T>
  void array(const char* name, const T*& field, std::initializer_list<Extent> extents) {
    if (!arrays_pass) return;
    require(data.contains(name), std::string("missing array '") + name + "'");
    py::array a = py::reinterpret_borrow<py::array>(data[name]);
    require(py::isinstance<py::array_t<T>>(a) && (a.flags() & py::array::c_style),
            std::string(name) + " must be a C-contiguous " + std::string(py::str(py::dtype::of<T>())) +
                " array");
    require(a.ndim() == static_cast<py::ssize_t>(extents.size()),
            std::string(name) + " must have " + std::to_string(extents.size()) + " axes");
    int axis = 0;
    for (const Extent& e : extents) {
      const py::ssize_t n = a.shape(axis);
      require(n <= std::numeric_limits<int>::max(), std::string(name) + " is too large");
      auto it = set_by.find(e.value);
      if (it == set_by.end()) {
        *e.value = static_cast<int>(n);
        set_by.emplace(e.value, name);
      } else {
        require(*e.value == n, std::string(name) + ": axis " + std::to_string(axis) + " (" +
                                   e.name + ") has length " + std::to_string(n) + " but " +
                                   e.name + " = " + std::to_string(*e.value) + " from " +
                                   it->second);
      }
      ++axis;
    }
    keep.push_back(a);
    field = static_cast<const T*>(a.data());
  }
  template <class T>
  void array(const char* name, T*& field, std::initializer_list<Extent> extents) {
    const T* p = nullptr;
    array(name, p, extents);
    field = const_cast<T*>(p);  // the model only reads it
  }
  template <class T>
  void scalar(const char* name, T& field) {
    if (arrays_pass) return;
    require(data.contains(name), std::string("missing scalar '") + name + "'");
    if constexpr (std::is_floating_point_v<T>) {
      field = static_cast<T>(data[name].cast<double>());
    } else {
      const long long v = data[name].cast<long long>();
      using I = std::conditional_t<std::is_enum_v<T>, int, T>;
      require(v >= static_cast<long long>(std::numeric_limits<I>::min()) &&
                  v <= static_cast<long long>(std::numeric_limits<I>::max()),
              std::string(name) + " is out of range");
      field = static_cast<T>(v);
      if constexpr (std::is_same_v<T, int>) set_by.emplace(&field, name);
    }
  }
};

// The offsets of the model's parameter groups, group_begin(model, k) for k = 0..G
// (core/config.hpp), checked: from 0 to dim(), each group non-empty.
template <class Model>
std::vector<int> checked_group_bounds(const Model& model) {
  const int D = model.dim(), G = n_groups(model);
  const std::string g = "the model's n_groups() = " + std::to_string(G);
  require(G >= 1 && G <= D, g + " must be between 1 and its dim() = " + std::to_string(D));
  if constexpr (!has_group_begin<Model>::value)
    require(D % G == 0, g + " equal blocks do not divide its dim() = " + std::to_string(D) +
                            "; declare group_begin(k) for blocks of unequal sizes");
  std::vector<int> b(G + 1);
  for (int k = 0; k <= G; ++k) b[k] = group_begin(model, k);
  const auto at = [&](int k) { return "group_begin(" + std::to_string(k) + ") = " +
                                      std::to_string(b[k]); };
  require(b[0] == 0, "the model's " + at(0) + ", must be 0");
  require(b[G] == D, "the model's " + at(G) + " (k = n_groups()), must be its dim() = " +
                         std::to_string(D));
  for (int k = 0; k < G; ++k)
    require(b[k] < b[k + 1], "the model's groups must be non-empty and in order: " + at(k) +
                                 ", " + at(k + 1));
  return b;
}

// The holder: the bound arrays stay alive as long as the model that views them.
template <class Model>
struct DeclaredCore {
  std::vector<py::object> keep;
  Model model{};
  explicit DeclaredCore(const py::dict& data) {
    Binder b{data, keep, false, {}};
    pysharp_fields(model, b);
    b.arrays_pass = true;
    pysharp_fields(model, b);
    require(model.dim() >= 1, "the model's dim() must be >= 1 for this data");
    require(model.work_size() >= 0, "the model's work_size() must be >= 0");
    checked_group_bounds(model);
  }
  DeclaredCore(const DeclaredCore&) = delete;
};

template <class Model, class Real>
void bind(py::module_& m) {
  static_assert(check_concept<Model, Real>());
  using Core = DeclaredCore<Model>;
  // module_local: two modules of one model name (an edited header, another dtype's
  // holder type is distinct anyway) must not collide in pybind11's global type registry.
  py::class_<Core> cls(m, "Model", py::module_local());
  cls.def(py::init<const py::dict&>(), py::arg("data"));
  cls.def_property_readonly("n_groups", [](const Core& c) { return n_groups(c.model); });
  cls.def_property_readonly("group_bounds",
                            [](const Core& c) { return py::cast(checked_group_bounds(c.model)); });
  // The struct as held here (its scalars and extents set, its pointers host addresses), for
  // the CuPy backend, which copies it to a kernel argument with device pointers instead.
  cls.def_property_readonly("_layout", [](Core& c) {
    Layout l{reinterpret_cast<const char*>(&c.model), py::list()};
    pysharp_fields(c.model, l);
    py::dict d;
    d["size"] = sizeof(Model);
    d["align"] = alignof(Model);
    d["bytes"] = py::bytes(reinterpret_cast<const char*>(&c.model), sizeof(Model));
    d["arrays"] = l.arrays;
    d["work_size"] = c.model.work_size();
    return d;
  });
  // A square-loss model gets the SGD tools; the engine of the scale-invariant runs
  // (sphere, projections, EoS tracking) is for the others only.
  if constexpr (is_square_loss<Model, Real>()) {
    module::bind_kernels<module::CpuExec, Core, Real>(cls);
    module::add_square_loss<Core, Real>(cls);
    m.attr("KIND") = "square_loss";
  } else {
    module::bind_cpu_model<Core, Real>(cls);
    m.attr("KIND") = "scale_invariant";
  }
  if constexpr (std::is_same_v<Real, double>) module::def_slq<Core>(m);
  Model probe{};
  Describer d;
  pysharp_fields(probe, d);
  m.attr("FIELDS") = d.fields;
  m.attr("MODEL_NAME") = pysharp_model_name(static_cast<const Model*>(nullptr));
  m.attr("DTYPE") = sizeof(Real) == 8 ? "float64" : "float32";
}

}  // namespace pysharp::declared

// The module of one loaded model and real type.
#define PYSHARP_LOADED_MODULE(module_name, Model, Real) \
  PYBIND11_MODULE(module_name, m) { ::pysharp::declared::bind<Model<Real>, Real>(m); }
