// The scale-invariant models of pysharp._core: their classes (kernels, Lanczos,
// the trajectory engine) in one precision; bind_models_f64.cpp and
// bind_models_f32.cpp instantiate it, one translation unit each.
#pragma once

#include "holders.hpp"

namespace pysharp::module {

template <class Real>
void bind_dtype(py::module_& m, const std::string& suffix) {
  py::class_<BNLinRegCore<Real>> linreg(m, ("BNLinearRegression" + suffix).c_str());
  module::def_init_BNLinearRegression<Real>(linreg);
  module::bind_cpu_model<BNLinRegCore<Real>, Real>(linreg);

  using MC = BNMatrixCompletionCore<Real>;
  py::class_<MC> mc(m, ("BNMatrixCompletion" + suffix).c_str());
  module::def_init_BNMatrixCompletion<Real>(mc);
  module::bind_cpu_model<MC, Real>(mc);
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
          const std::int64_t D = c.model.dim();
#pragma omp parallel
          {
            std::vector<Real> work(std::max(c.model.N, Nt) + 1);
#pragma omp for schedule(static)
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

  using BN2 = BNTwoLayerNetCore<Real>;
  py::class_<BN2> bn2(m, ("BNTwoLayerNet" + suffix).c_str());
  module::def_init_BNTwoLayerNet<Real>(bn2);
  module::bind_cpu_model<BN2, Real>(bn2);

  py::class_<Toy3DCore<Real>> toy(m, ("Toy3D" + suffix).c_str());
  module::def_init_Toy3D<Real>(toy);
  module::bind_cpu_model<Toy3DCore<Real>, Real>(toy);
}

}  // namespace pysharp::module
