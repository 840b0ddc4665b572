// The one header a model includes: everything its loss_grad may use, and the
// declaration that tells pysharp which of its fields are data.
//
// A model is a struct template over the real type with
//
//   PYSHARP_HD int dim() const;          // number of parameters D
//   PYSHARP_HD int work_size() const;    // scratch values loss_grad may use
//   template <class S>
//   PYSHARP_HD mask_t<S> loss_grad(const S* w, S* loss, S* g, S* work) const;
//
// written once for every S the engine instantiates: the real type, jets
// (Jet<Real, N>: exact HVPs and third derivatives), SIMD lane blocks
// (Lanes<Real, W>) and jets of lane blocks. loss_grad returns, per lane,
// whether the loss is defined at w (a zero normaliser: false). Optional:
// `int n_groups() const` (the loss is invariant to the scale of each of G
// contiguous blocks of w separately: equal blocks, or those whose offsets
// `int group_begin(int k) const` gives, core/config.hpp), and the top-coefficient form
// `template <class S, class G> loss_grad(const S*, S*, G* g, S*)` of
// models/derivatives.hpp.
//
// A square-loss model L = (1/2n) sum_i (f(x_i; w) - y_i)^2, which SGD and the
// linear-stability tools take, binds its data as `X` (n, d) and `y` (n,) and
// adds n_samples(), input_dim(), the per-sample sample() and jacobian(), with
// `return square_loss_grad(*this, w, loss, g, work);` as its loss_grad
// (models/square_loss.hpp has the contract and two examples).
//
// After the struct, at the same namespace scope,
//
//   PYSHARP_MODEL(Name, PYSHARP_ARRAY(X, n, d), PYSHARP_ARRAY(y, n), PYSHARP_SCALAR(c))
//
// declares the fields bound from Python by name: a PYSHARP_ARRAY is a
// `const Real*` (or `const int*`) member, C-contiguous, with one int member
// per axis that pysharp fills from the array's shape (an extent named twice
// must agree); a PYSHARP_SCALAR is a Real, double, float or int member. The
// declaration only defines two functions found by argument-dependent lookup
// (pysharp_fields, pysharp_model_name); it needs no Python and costs nothing
// in a build that does not bind the model.
//
// The math available inside loss_grad, on every S above:
//   + - * /, compound assignment;
//   < > <= >= == != between S values and with Real constants: they compare the
//   value part (value_of) and give mask_t<S>, combined with & | !;
//   sqrt_, exp_, expm1_, log_, log1p_, tanh_,
//   sin_, cos_, erf_, erfc_, atan2_(y, x)        elementary functions;
//   select(mask, a, b)                            a where mask, else b (no branch);
//   value_of(x)                                   the value part of a jet (for tests
//                                                 of degeneracy, not for arithmetic);
//   matvec_rows, matvec_cols, dot_split           register-blocked products (core/dense.hpp);
//   bn_cosine_loss_grad                           the BatchNorm square loss (core/bn_cosine.hpp);
//   square_loss_grad                              a square-loss model's loss_grad (core/square_loss.hpp);
//   machine_eps<Real>()                           unit roundoff.
// Branch on data only through select: lanes of one block hold different points.
#pragma once

#include "pysharp/core/activation.hpp"
#include "pysharp/core/bn_cosine.hpp"
#include "pysharp/core/config.hpp"
#include "pysharp/core/dense.hpp"
#include "pysharp/core/jet.hpp"
#include "pysharp/core/square_loss.hpp"
#include "pysharp/models/derivatives.hpp"

namespace pysharp {

// One axis of a bound array: its name and the model's int member that holds it.
struct Extent {
  const char* name;
  int* value;
};

}  // namespace pysharp

// The names above, for models written outside namespace pysharp (a user's
// header): arguments of scalar type find no overload by argument-dependent lookup.
using pysharp::bn_cosine_loss_grad;
using pysharp::dot_split;
using pysharp::exp_;
using pysharp::expm1_;
using pysharp::Jet;
using pysharp::lane_real_t;
using pysharp::log_;
using pysharp::log1p_;
using pysharp::machine_eps;
using pysharp::mask_t;
using pysharp::matvec_cols;
using pysharp::matvec_rows;
using pysharp::select;
using pysharp::sin_;
using pysharp::cos_;
using pysharp::erf_;
using pysharp::erfc_;
using pysharp::atan2_;
using pysharp::sqrt_;
using pysharp::square_loss_grad;
using pysharp::tanh_;
using pysharp::value_of;
using pysharp::value_t;

// -- preprocessor plumbing: PYSHARP_PP_MAP(f, a, b, ...) -> f(a), f(b), ... (up to 8) --
#define PYSHARP_PP_CAT_(a, b) a##b
#define PYSHARP_PP_CAT(a, b) PYSHARP_PP_CAT_(a, b)
#define PYSHARP_PP_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, N, ...) N
#define PYSHARP_PP_COUNT(...) PYSHARP_PP_COUNT_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define PYSHARP_PP_MAP1(f, x) f(x)
#define PYSHARP_PP_MAP2(f, x, ...) f(x), PYSHARP_PP_MAP1(f, __VA_ARGS__)
#define PYSHARP_PP_MAP3(f, x, ...) f(x), PYSHARP_PP_MAP2(f, __VA_ARGS__)
#define PYSHARP_PP_MAP4(f, x, ...) f(x), PYSHARP_PP_MAP3(f, __VA_ARGS__)
#define PYSHARP_PP_MAP5(f, x, ...) f(x), PYSHARP_PP_MAP4(f, __VA_ARGS__)
#define PYSHARP_PP_MAP6(f, x, ...) f(x), PYSHARP_PP_MAP5(f, __VA_ARGS__)
#define PYSHARP_PP_MAP7(f, x, ...) f(x), PYSHARP_PP_MAP6(f, __VA_ARGS__)
#define PYSHARP_PP_MAP8(f, x, ...) f(x), PYSHARP_PP_MAP7(f, __VA_ARGS__)
#define PYSHARP_PP_MAP(f, ...) \
  PYSHARP_PP_CAT(PYSHARP_PP_MAP, PYSHARP_PP_COUNT(__VA_ARGS__))(f, __VA_ARGS__)
#define PYSHARP_PP_EXTENT(x) ::pysharp::Extent{#x, &pysharp_m.x}

// An array member `field` and the int members that hold its extents, one per axis.
#define PYSHARP_ARRAY(field, ...) \
  pysharp_v.array(#field, pysharp_m.field, {PYSHARP_PP_MAP(PYSHARP_PP_EXTENT, __VA_ARGS__)})
// A scalar member bound from Python.
#define PYSHARP_SCALAR(field) pysharp_v.scalar(#field, pysharp_m.field)

// Declares Model's bound fields; see the top of this file. Place it after the
// struct, in the struct's namespace.
#define PYSHARP_MODEL(Model, ...)                                             \
  template <class PysharpReal, class PysharpVisitor>                          \
  inline void pysharp_fields(Model<PysharpReal>& pysharp_m,                   \
                             PysharpVisitor& pysharp_v) {                     \
    (void)pysharp_m;                                                          \
    (void)pysharp_v;                                                          \
    __VA_ARGS__;                                                              \
  }                                                                           \
  template <class PysharpReal>                                                \
  constexpr const char* pysharp_model_name(const Model<PysharpReal>*) {       \
    return #Model;                                                            \
  }
