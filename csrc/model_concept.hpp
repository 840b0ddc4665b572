// What a model declared with PYSHARP_MODEL (pysharp/model.hpp) must offer, checked
// with messages that name the missing member, and its fields as plain records (name,
// type, byte offset, extents). No Python here: both pysharp._core (bind_declared.hpp)
// and a run-time compiled model's library (loaded_abi.hpp) read a model through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>
#include <vector>

#include "pysharp/model.hpp"

namespace pysharp::declared {

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

// -- the fields as records --

// The element type of an array field or the type of a scalar one.
enum class FieldType : int { f64, f32, i8, i16, i32, i64, u8, u16, u32, u64 };

template <class T>
constexpr FieldType field_type() {
  if constexpr (std::is_enum_v<T>) {
    static_assert(sizeof(T) == sizeof(int), "PYSHARP_SCALAR: an enum member must be int-sized");
    return FieldType::i32;
  } else if constexpr (std::is_same_v<T, double>) {
    return FieldType::f64;
  } else if constexpr (std::is_same_v<T, float>) {
    return FieldType::f32;
  } else {
    static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>,
                  "pysharp model: a field must be a float, a double, an integer or an enum "
                  "(or a pointer to one of these)");
    constexpr bool s = std::is_signed_v<T>;
    if constexpr (sizeof(T) == 1) return s ? FieldType::i8 : FieldType::u8;
    if constexpr (sizeof(T) == 2) return s ? FieldType::i16 : FieldType::u16;
    if constexpr (sizeof(T) == 4) return s ? FieldType::i32 : FieldType::u32;
    return s ? FieldType::i64 : FieldType::u64;
  }
}

inline constexpr int kMaxExtents = 8;  // PYSHARP_ARRAY names at most 8 (pysharp/model.hpp)

// One field of the struct: where it sits and what it holds. An array field is a pointer
// member whose axes' lengths are int members of the same struct (its extents).
struct FieldRecord {
  const char* name;
  bool is_array;
  bool is_enum;  // a scalar of an enum type (bound from a Python int)
  FieldType type;
  std::size_t offset;  // of the member: the pointer of an array, the value of a scalar
  int n_extents;
  const char* extent_names[kMaxExtents];
  std::size_t extent_offsets[kMaxExtents];
};

// Visits pysharp_fields(model) and records each field, offsets relative to the model.
struct Recorder {
  const char* base;
  std::vector<FieldRecord> fields;
  std::size_t at(const void* member) const {
    return static_cast<std::size_t>(static_cast<const char*>(member) - base);
  }
  template <class T>
  void array(const char* name, T* const& field, std::initializer_list<Extent> extents) {
    FieldRecord r{name, true, false, field_type<std::remove_const_t<T>>(), at(&field), 0, {}, {}};
    for (const Extent& e : extents) {
      r.extent_names[r.n_extents] = e.name;
      r.extent_offsets[r.n_extents++] = at(e.value);
    }
    fields.push_back(r);
  }
  template <class T>
  void scalar(const char* name, const T& field) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>,
                  "PYSHARP_SCALAR: the member must be a number or an enum");
    fields.push_back({name, false, std::is_enum_v<T>, field_type<T>(), at(&field), 0, {}, {}});
  }
};

// The records of Model's fields in declaration order (the same for every object of it).
template <class Model>
std::vector<FieldRecord> field_records() {
  Model probe{};
  Recorder r{reinterpret_cast<const char*>(&probe), {}};
  pysharp_fields(probe, r);
  return r.fields;
}

}  // namespace pysharp::declared
