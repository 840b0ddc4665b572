// A model declared with PYSHARP_MODEL (pysharp/model.hpp) bound from a dict of its
// fields by name, through its field records (model_concept.hpp): the holder of
// pysharp._core's built-ins that need no more than their fields (DeclaredCore,
// csrc/holders.hpp), and, through the same functions, of every run-time compiled
// model (LoadedCore, bind_loaded.cpp), whose struct _core knows only by its records.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/bind_cpu.hpp"
#include "model_concept.hpp"

namespace pysharp::declared {

namespace py = pybind11;
using module::require;

// f(T{}) for the C++ type T of a field.
template <class F>
decltype(auto) with_type(FieldType t, F&& f) {
  switch (t) {
    case FieldType::f64: return f(double{});
    case FieldType::f32: return f(float{});
    case FieldType::i8: return f(std::int8_t{});
    case FieldType::i16: return f(std::int16_t{});
    case FieldType::i32: return f(std::int32_t{});
    case FieldType::i64: return f(std::int64_t{});
    case FieldType::u8: return f(std::uint8_t{});
    case FieldType::u16: return f(std::uint16_t{});
    case FieldType::u32: return f(std::uint32_t{});
    case FieldType::u64: return f(std::uint64_t{});
  }
  throw std::logic_error("pysharp: a field record of an unknown type");
}

// The fields as Python sees them: a list of dicts {name, kind, dtype, extents}.
inline py::list describe(const std::vector<FieldRecord>& fields) {
  py::list out;
  for (const FieldRecord& r : fields) {
    py::list axes;
    for (int i = 0; i < r.n_extents; ++i) axes.append(r.extent_names[i]);
    py::dict f;
    f["name"] = r.name;
    f["kind"] = r.is_array ? "array" : "scalar";
    if (r.is_array)
      f["dtype"] = with_type(r.type, [](auto v) { return py::str(py::dtype::of<decltype(v)>()); });
    else
      f["dtype"] = r.type == FieldType::f64 || r.type == FieldType::f32 ? "float" : "int";
    f["extents"] = axes;
    out.append(f);
  }
  return out;
}

// The struct as held (its scalars, extents and derived fields set, its pointers host
// addresses), where each array field's pointer sits in it (byte offsets) and a copy of
// each array (its extents read from the struct), for the CuPy backend, which copies the
// struct to a kernel argument with device pointers instead (pysharp/_backends/_cupy.py).
inline py::dict layout(const std::vector<FieldRecord>& fields, const void* model,
                       std::size_t size, std::size_t align, int work_size) {
  const char* base = static_cast<const char*>(model);
  py::list arrays;
  py::dict data;
  for (const FieldRecord& r : fields) {
    if (!r.is_array) continue;
    arrays.append(py::make_tuple(r.name, r.offset));
    std::vector<py::ssize_t> shape;
    for (int axis = 0; axis < r.n_extents; ++axis) {
      int n;
      std::memcpy(&n, base + r.extent_offsets[axis], sizeof n);
      shape.push_back(n);
    }
    const void* p;
    std::memcpy(&p, base + r.offset, sizeof p);
    data[r.name] = with_type(r.type, [&](auto v) {
      py::array_t<decltype(v)> a(shape);
      if (a.size()) std::memcpy(a.mutable_data(), p, a.nbytes());
      return py::array(a);
    });
  }
  py::dict d;
  d["size"] = size;
  d["align"] = align;
  d["bytes"] = py::bytes(base, size);
  d["arrays"] = arrays;
  d["data"] = data;
  d["work_size"] = work_size;
  return d;
}

// layout() of a declared model's struct.
template <class Model>
py::dict layout_of(const Model& model) {
  static const std::vector<FieldRecord> fields = field_records<Model>();
  return layout(fields, &model, sizeof(Model), alignof(Model), model.work_size());
}

// Fills the model at `base` from a dict of NumPy arrays and numbers (validated and
// converted by pysharp/models/_loaded.py, or by a built-in's constructor in
// bind_model.hpp; the checks here guard a direct call). Scalars first, then arrays, so
// an int scalar may also be an extent. `keep` holds the arrays the model views.
inline void bind_fields(const std::vector<FieldRecord>& fields, char* base, const py::dict& data,
                        std::vector<py::object>& keep) {
  std::map<std::size_t, std::string> set_by;  // an extent's offset -> the field that fixed it
  for (const FieldRecord& r : fields) {
    if (r.is_array) continue;
    const std::string name = r.name;
    require(data.contains(r.name), "missing scalar '" + name + "'");
    with_type(r.type, [&](auto v) {
      using T = decltype(v);
      T value;
      if constexpr (std::is_floating_point_v<T>) {
        value = static_cast<T>(data[r.name].template cast<double>());
      } else {
        const long long x = data[r.name].template cast<long long>();
        using L = std::numeric_limits<T>;
        const bool fits = std::is_signed_v<T>
            ? x >= static_cast<long long>(L::min()) && x <= static_cast<long long>(L::max())
            : x >= 0 && static_cast<unsigned long long>(x) <= L::max();
        require(fits, name + " is out of range");
        value = static_cast<T>(x);
        if (std::is_same_v<T, int> && !r.is_enum) set_by.emplace(r.offset, name);
      }
      std::memcpy(base + r.offset, &value, sizeof value);  // an enum member too
    });
  }
  for (const FieldRecord& r : fields) {
    if (!r.is_array) continue;
    const std::string name = r.name;
    require(data.contains(r.name), "missing array '" + name + "'");
    py::array a = py::reinterpret_borrow<py::array>(data[r.name]);
    with_type(r.type, [&](auto v) {
      using T = decltype(v);
      require(py::isinstance<py::array_t<T>>(a) && (a.flags() & py::array::c_style),
              name + " must be a C-contiguous " + std::string(py::str(py::dtype::of<T>())) +
                  " array");
    });
    require(a.ndim() == r.n_extents,
            name + " must have " + std::to_string(r.n_extents) + " axes");
    for (int axis = 0; axis < r.n_extents; ++axis) {
      const py::ssize_t n = a.shape(axis);
      require(n <= std::numeric_limits<int>::max(), name + " is too large");
      const std::string extent = r.extent_names[axis];
      int* value = reinterpret_cast<int*>(base + r.extent_offsets[axis]);
      auto it = set_by.find(r.extent_offsets[axis]);
      if (it == set_by.end()) {
        *value = static_cast<int>(n);
        set_by.emplace(r.extent_offsets[axis], name);
      } else {
        require(*value == n, name + ": axis " + std::to_string(axis) + " (" + extent +
                                 ") has length " + std::to_string(n) + " but " + extent + " = " +
                                 std::to_string(*value) + " from " + it->second);
      }
    }
    keep.push_back(a);
    const void* data_pointer = a.data();  // the model only reads it
    std::memcpy(base + r.offset, &data_pointer, sizeof data_pointer);
  }
}

// The offsets 0 = b_0 < ... < b_G = D of a model's parameter groups, begin(k) for
// k = 0..G (core/config.hpp), checked: from 0 to D, each group non-empty. Without
// `declares_begin` (the model's own group_begin(k)) the G blocks must be equal.
template <class Begin>
std::vector<int> checked_group_bounds(int D, int G, bool declares_begin, Begin&& begin) {
  const std::string g = "the model's n_groups() = " + std::to_string(G);
  require(G >= 1 && G <= D, g + " must be between 1 and its dim() = " + std::to_string(D));
  if (!declares_begin)
    require(D % G == 0, g + " equal blocks do not divide its dim() = " + std::to_string(D) +
                            "; declare group_begin(k) for blocks of unequal sizes");
  std::vector<int> b(G + 1);
  for (int k = 0; k <= G; ++k) b[k] = begin(k);
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

template <class Model>
std::vector<int> checked_group_bounds(const Model& model) {
  return checked_group_bounds(model.dim(), n_groups(model), has_group_begin<Model>::value,
                              [&](int k) { return group_begin(model, k); });
}

// The holder: the bound arrays stay alive as long as the model that views them.
template <class Model>
struct DeclaredCore {
  std::vector<py::object> keep;
  Model model{};
  explicit DeclaredCore(const py::dict& data) {
    static const std::vector<FieldRecord> fields = field_records<Model>();
    bind_fields(fields, reinterpret_cast<char*>(&model), data, keep);
    require(model.dim() >= 1, "the model's dim() must be >= 1 for this data");
    require(model.work_size() >= 0, "the model's work_size() must be >= 0");
    checked_group_bounds(model);
  }
  DeclaredCore(const DeclaredCore&) = delete;
};

}  // namespace pysharp::declared
