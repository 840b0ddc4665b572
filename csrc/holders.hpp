// The holders of pysharp._core's built-in models: each owns its model's arrays
// and builds the model view (the same POD struct a CUDA kernel receives), and
// the entry points of the module's translation units (bindings.cpp registers
// them; each unit compiles on its own, in parallel).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bind_declared.hpp"
#include "cpu/bind_cpu.hpp"
#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/bn_two_layer_net.hpp"
#include "pysharp/models/square_loss.hpp"
#include "pysharp/models/toy3d.hpp"

namespace pysharp::module {

template <class T>
std::vector<T> to_vector(const carray<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.size());
}


// Owners keep the model's arrays alive; the model itself is a view of them
// (the same POD struct a CUDA kernel receives).
template <class Real>
struct BNLinearRegressionCore {
  std::vector<Real> Xc, u, sigma, inv_sigma, sigma2, ut, V;
  BNLinearRegression<Real> model;
  BNLinRegSpectral<Real> spectral;  // the reduced form used by the engine
  BNLinearRegressionCore(const carray<Real>& Xc_, const carray<Real>& u_, double scale,
               const carray<Real>& sigma_, const carray<Real>& ut_, const carray<Real>& V_,
               double uperp2)
      : Xc(to_vector(Xc_)), u(to_vector(u_)), sigma(to_vector(sigma_)), ut(to_vector(ut_)),
        V(to_vector(V_)) {
    require(Xc_.ndim() == 2 && u_.ndim() == 1 && u_.shape(0) == Xc_.shape(0),
            "Xc must be (n, d) and u (n,)");
    const int n = static_cast<int>(Xc_.shape(0)), d = static_cast<int>(Xc_.shape(1));
    const int r = static_cast<int>(sigma.size());
    require(r >= 1 && ut.size() == sigma.size() && V_.ndim() == 2 && V_.shape(0) == d &&
                V_.shape(1) == r,
            "sigma and ut must be (r,), V (d, r)");
    for (Real sv : sigma) {
      require(sv > Real(0), "sigma must be positive");
      inv_sigma.push_back(Real(1) / sv);
      sigma2.push_back(sv * sv);
    }
    double fro2 = 0;
    for (Real x : Xc) fro2 += double(x) * double(x);
    model = {Xc.data(), u.data(), static_cast<Real>(scale), static_cast<Real>(fro2), n, d};
    spectral = {sigma.data(), inv_sigma.data(), sigma2.data(), ut.data(), V.data(),
                static_cast<Real>(uperp2), static_cast<Real>(fro2),
                static_cast<Real>(scale), r, d};
  }
  BNLinearRegressionCore(const BNLinearRegressionCore&) = delete;
};

// Models whose holder is no more than their fields: the holder of any declared model
// (bind_declared.hpp), the one run-time compiled models use; bind_model.hpp's
// def_init_* (bind_stability.cpp's, for the square-loss models) derive their fields
// from the constructor's arguments.
template <class Real>
using BNMatrixCompletionCore = declared::DeclaredCore<BNMatrixCompletion<Real>>;
template <class Real>
using BNTwoLayerNetCore = declared::DeclaredCore<BNTwoLayerNet<Real>>;
template <class Real>
using Toy3DCore = declared::DeclaredCore<Toy3D<Real>>;
template <class Real>
using LinearRegressionCore = declared::DeclaredCore<LinearRegression<Real>>;
template <class Real>
using TwoLayerNetCore = declared::DeclaredCore<TwoLayerNet<Real>>;

// The units' entry points.
void bind_models_f64(py::module_& m);  // bind_models.cpp: the scale-invariant models
void bind_models_f32(py::module_& m);
void bind_stability(py::module_& m);   // bind_stability.cpp: SGD linear stability
void bind_spectra(py::module_& m);     // bind_spectra.cpp: SLQ
void bind_tile(py::module_& m);        // bind_tile.cpp: the GPU tiles on an emulated warp
void bind_loaded(py::module_& m);      // bind_loaded.cpp: run-time compiled models' tables

}  // namespace pysharp::module
