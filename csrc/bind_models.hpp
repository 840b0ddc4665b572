// The scale-invariant models of pysharp._core: their classes (kernels, Lanczos,
// the trajectory engine) in one precision; bind_models_f64.cpp and
// bind_models_f32.cpp instantiate it, one translation unit each.
#pragma once

#include "builtin_models.hpp"
#include "holders.hpp"
#include "cpu/threads.hpp"

namespace pysharp::module {

// What a model's class offers beyond bind_cpu_model: nothing, but for the overloads below.
template <class Holder>
void bind_extras(py::class_<Holder>&) {}

// BN matrix completion's loss on held-out entries.
template <class Real>
void bind_extras(py::class_<BNMatrixCompletionCore<Real>>& mc) {
  using MC = BNMatrixCompletionCore<Real>;
  mc.def(
      "test_loss",
      [](const MC& c, const carray<Real>& W, const carray<int>& rows,
         const carray<int>& cols, const carray<Real>& values, double value_mean,
         double value_std) {
        const std::int64_t B = checked_batch(c, W, "W");
        const int Nt = static_cast<int>(values.size());
        require(rows.size() == Nt && cols.size() == Nt,
                "rows, cols and values must have one entry per held-out observation");
        for (int k = 0; k < Nt; ++k)
          require(rows.data()[k] >= 0 && rows.data()[k] < c.model.m1 &&
                      cols.data()[k] >= 0 && cols.data()[k] < c.model.m2,
                  "held-out index out of range");
        carray<Real> loss(B);
        flags ok(B);
        {
          py::gil_scoped_release nogil;
          const pysharp::cpu::CoreShare cores;
          const std::int64_t D = c.model.dim(), grain = cpu::dynamic_grain(B);
#pragma omp parallel if (B > 1)
          {
            std::vector<Real> work(std::max(c.model.N, Nt) + 1);
#pragma omp for schedule(dynamic, grain)
            for (std::int64_t b = 0; b < B; ++b)
              ok.mutable_data()[b] = bn_mc_test_loss(
                  c.model, W.data() + b * D, rows.data(), cols.data(), values.data(), Nt,
                  static_cast<Real>(value_mean), static_cast<Real>(value_std),
                  loss.mutable_data() + b, work.data());
          }
        }
        return py::make_tuple(loss, ok);
      },
      py::arg("W"), py::arg("rows"), py::arg("cols"), py::arg("values"),
      py::arg("value_mean"), py::arg("value_std"));
}

// The class <Model><suffix> of every model of builtin_models.hpp, in one precision.
template <class Real>
void bind_dtype(py::module_& m, const std::string& suffix) {
#define PYSHARP_BIND_MODEL(Model)                                               \
  {                                                                             \
    py::class_<Model##Core<Real>> cls(m, (#Model + suffix).c_str());            \
    module::def_init_##Model<Real>(cls);                                        \
    module::bind_cpu_model<Model##Core<Real>, Real>(cls);                       \
    cls.def_property_readonly("_layout", [](const Model##Core<Real>& c) {       \
      return declared::layout_of(c.model);                                      \
    });                                                                         \
    bind_extras(cls);                                                           \
  }
  PYSHARP_BUILTIN_MODELS(PYSHARP_BIND_MODEL)
#undef PYSHARP_BIND_MODEL
}

}  // namespace pysharp::module
