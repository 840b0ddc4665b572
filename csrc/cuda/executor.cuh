// The CUDA executor of pysharp._cuda: device buffers, the models' device mirrors,
// CudaExec (the bindings' calls as copies and kernel launches) and the Python classes.
// Shared by the module's translation units: module.cu defines the module, and one
// generated unit per model and precision (bind_unit.cu.in) binds its class, so the
// heavy kernel instantiations compile in parallel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "builtin_models.hpp"
#include "bind_model.hpp"
#include "cuda/kernels.cuh"

namespace pysharp::cuda_module {

namespace py = pybind11;
using module::carray;
using module::flags;

inline constexpr int kThreads = 128;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

using module::require;

inline int blocks_for(long long n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

// Owns n elements of device memory.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n = 0) : n_(n) {
    if (n_) check(cudaMalloc(&p_, n_ * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const T* host, std::size_t n) : DeviceBuffer(n) {
    if (n_) check(cudaMemcpy(p_, host, n_ * sizeof(T), cudaMemcpyHostToDevice), "copy to device");
  }
  template <class A>
  static DeviceBuffer from(const A& a) { return DeviceBuffer(a.data(), a.size()); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  T* get() const { return p_; }
  void to(T* host) const {
    if (n_) check(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "copy to host");
  }
  void fill_zero() { if (n_) check(cudaMemset(p_, 0, n_ * sizeof(T)), "cudaMemset"); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

inline void finish_launch(const char* what) {
  check(cudaGetLastError(), what);
  check(cudaDeviceSynchronize(), what);
}

template <class Real>
struct BNLinRegCuda {
  DeviceBuffer<Real> Xc, u, sigma, inv_sigma, sigma2, ut, V;
  BNLinearRegression<Real> model;
  BNLinRegSpectral<Real> spectral;
  BNLinRegCuda(const carray<Real>& Xc_, const carray<Real>& u_, double scale,
               const carray<Real>& sigma_, const carray<Real>& ut_, const carray<Real>& V_,
               double uperp2)
      : Xc(DeviceBuffer<Real>::from(Xc_)), u(DeviceBuffer<Real>::from(u_)),
        sigma(DeviceBuffer<Real>::from(sigma_)), ut(DeviceBuffer<Real>::from(ut_)),
        V(DeviceBuffer<Real>::from(V_)) {
    require(Xc_.ndim() == 2 && u_.ndim() == 1 && u_.shape(0) == Xc_.shape(0),
            "Xc must be (n, d) and u (n,)");
    const int n = static_cast<int>(Xc_.shape(0)), d = static_cast<int>(Xc_.shape(1));
    const int r = static_cast<int>(sigma_.size());
    require(r >= 1 && ut_.size() == r && V_.ndim() == 2 && V_.shape(0) == d && V_.shape(1) == r,
            "sigma and ut must be (r,), V (d, r)");
    std::vector<Real> inv(r), sq(r);
    for (int k = 0; k < r; ++k) {
      const Real s = sigma_.data()[k];
      require(s > Real(0), "sigma must be positive");
      inv[k] = Real(1) / s;
      sq[k] = s * s;
    }
    inv_sigma = DeviceBuffer<Real>(inv.data(), r);
    sigma2 = DeviceBuffer<Real>(sq.data(), r);
    double fro2 = 0;
    for (py::ssize_t i = 0; i < Xc_.size(); ++i) fro2 += double(Xc_.data()[i]) * Xc_.data()[i];
    model = {Xc.get(), u.get(), static_cast<Real>(scale), static_cast<Real>(fro2), n, d};
    spectral = {sigma.get(), inv_sigma.get(), sigma2.get(), ut.get(), V.get(),
                static_cast<Real>(uperp2), static_cast<Real>(fro2), static_cast<Real>(scale), r, d};
  }
};

template <class Real>
struct BNMatrixCompletionCuda {
  DeviceBuffer<int> rows, cols;
  DeviceBuffer<Real> u;
  BNMatrixCompletion<Real> model;
  BNMatrixCompletionCuda(const carray<int>& rows_, const carray<int>& cols_,
                         const carray<Real>& u_, double scale, int m1, int m2, int r)
      : rows(DeviceBuffer<int>::from(rows_)), cols(DeviceBuffer<int>::from(cols_)),
        u(DeviceBuffer<Real>::from(u_)) {
    require(rows_.size() == u_.size() && cols_.size() == u_.size(),
            "rows, cols and u must have one entry per observation");
    for (py::ssize_t k = 0; k < rows_.size(); ++k)
      require(rows_.data()[k] >= 0 && rows_.data()[k] < m1 && cols_.data()[k] >= 0 &&
                  cols_.data()[k] < m2,
              "observation index out of range");
    model = {rows.get(), cols.get(), u.get(), static_cast<Real>(scale),
             static_cast<int>(u_.size()), m1, m2, r};
  }
};

template <class Real>
struct BNTwoLayerNetCuda {
  DeviceBuffer<Real> Xc, y;
  BNTwoLayerNet<Real> model;
  BNTwoLayerNetCuda(const carray<Real>& Xc_, const carray<Real>& y_, int width, int activation)
      : Xc(DeviceBuffer<Real>::from(Xc_)), y(DeviceBuffer<Real>::from(y_)) {
    require(Xc_.ndim() == 2 && y_.ndim() == 1 && y_.shape(0) == Xc_.shape(0),
            "Xc must be (n, d) and y (n,)");
    require(width >= 1 && (activation == 0 || activation == 1),
            "width must be >= 1 and activation 0 (tanh) or 1 (relu)");
    double fro2 = 0;
    for (py::ssize_t i = 0; i < Xc_.size(); ++i) fro2 += double(Xc_.data()[i]) * Xc_.data()[i];
    model = {Xc.get(), y.get(), static_cast<Real>(fro2),
             static_cast<Real>(1 / std::sqrt(double(width))), static_cast<int>(Xc_.shape(0)),
             static_cast<int>(Xc_.shape(1)), width, static_cast<Activation>(activation)};
  }
};

template <class Real>
struct Toy3DCuda {
  Toy3D<Real> model;
  explicit Toy3DCuda(double c) : model{static_cast<Real>(c)} {}
};

// How many trajectories one launch runs: bounded by a quarter of free device memory.
inline long long launch_chunk(long long B, long long bytes_each) {
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const long long cap = std::max<long long>(1, static_cast<long long>(free_b / 4) /
                                                   std::max<long long>(1, bytes_each));
  return std::min(B, cap);
}

// Runs the bindings' calls (bind_model.hpp) on the GPU, one thread per row:
// inputs copied to the device, kernels launched, results copied back.
struct CudaExec {
  template <class Core, class Real>
  static void loss_grad(const Core& c, const Real* W, long long B, Real* loss, Real* G,
                        std::uint8_t* ok) {
    const int D = c.model.dim();
    DeviceBuffer<Real> dW(W, B * D), dl(B), dG(B * D),
        work(B * std::max(1, c.model.work_size()));
    DeviceBuffer<std::uint8_t> dok(B);
    cuda::loss_grad_kernel<<<blocks_for(B), kThreads>>>(c.model, dW.get(), B, dl.get(),
                                                       dG.get(), work.get(), dok.get());
    finish_launch("loss_grad");
    dl.to(loss);
    dG.to(G);
    dok.to(ok);
  }

  template <int N, class Core, class Real>
  static void directional(const Core& c, const Real* W, const Real* V, long long B, Real* out,
                          std::uint8_t* ok) {
    const int D = c.model.dim();
    DeviceBuffer<Real> dW(W, B * D), dV(V, B * D), dout(B * D);
    DeviceBuffer<Jet<Real, N>> jets(B * jet_scratch_size(c.model));
    DeviceBuffer<std::uint8_t> dok(B);
    cuda::directional_kernel<N><<<blocks_for(B), kThreads>>>(c.model, dW.get(), dV.get(), B,
                                                             dout.get(), jets.get(), dok.get());
    finish_launch(N == 1 ? "hvp" : "third");
    dout.to(out);
    dok.to(ok);
  }

  template <class Core, class Real>
  static void hessian(const Core& c, const Real* W, long long B, Real* H, std::uint8_t* ok) {
    const long long D = c.model.dim();
    DeviceBuffer<Real> dW(W, B * D), dH(B * D * D), e(B * D * D), col(B * D * D);
    DeviceBuffer<Jet<Real, 1>> jets(B * D * jet_scratch_size(c.model));
    DeviceBuffer<std::uint8_t> bad(B);
    bad.fill_zero();
    cuda::hessian_kernel<<<blocks_for(B * D), kThreads>>>(c.model, dW.get(), B, dH.get(),
                                                         e.get(), col.get(), jets.get(),
                                                         bad.get());
    finish_launch("hessian");
    dH.to(H);
    bad.to(ok);
    for (long long b = 0; b < B; ++b) ok[b] = !ok[b];
  }

  template <class Core, class Real>
  static void lanczos(const Core& c, const LanczosOptions& o, const Real* W, const Real* start,
                      const std::uint64_t* streams, long long B, Real* evals, Real* evecs,
                      Real* resid, int* iterations, std::uint8_t* converged, std::uint8_t* ok) {
    const int D = c.model.dim(), k = o.k;
    DeviceBuffer<Real> dW(W, B * D);
    DeviceBuffer<Real> dS = start ? DeviceBuffer<Real>(start, B * D) : DeviceBuffer<Real>();
    DeviceBuffer<std::uint64_t> dstreams =
        streams ? DeviceBuffer<std::uint64_t>(streams, B) : DeviceBuffer<std::uint64_t>();
    DeviceBuffer<Real> dev(B * k), dvec(B * k * D), dres(B * k);
    DeviceBuffer<Real> scratch(B * lanczos_scratch_size(D, o));
    DeviceBuffer<Jet<Real, 1>> jets(B * jet_scratch_size(c.model));
    DeviceBuffer<int> dit(B);
    DeviceBuffer<std::uint8_t> dconv(B), dok(B);
    cuda::lanczos_kernel<<<blocks_for(B), kThreads>>>(
        c.model, o, dW.get(), start ? dS.get() : nullptr, streams ? dstreams.get() : nullptr, B,
        dev.get(), dvec.get(), dres.get(),
        dit.get(), dconv.get(), dok.get(), scratch.get(), jets.get());
    finish_launch("lanczos");
    dev.to(evals);
    dvec.to(evecs);
    dres.to(resid);
    dit.to(iterations);
    dconv.to(converged);
    dok.to(ok);
  }

  template <class Core, class Real>
  static void run(const Core& c, const EngineConfig& cfg, bool reduced, const Real* W0,
                  const Hyperparameters<Real>& h, long long B, long long offset,
                  module::RunOutputs<Real>& out) {
    const int D = c.model.dim();
    // A device mirror of every output array; empty ones (not asked for) stay null.
    auto arrays = out.arrays();
    std::vector<DeviceBuffer<char>> mirror;
    mirror.reserve(arrays.size());
    std::array<void*, module::RunOutputs<Real>::kArrays> dev{};
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      mirror.emplace_back(static_cast<std::size_t>(arrays[i]->nbytes()));
      dev[i] = arrays[i]->size() ? mirror.back().get() : nullptr;
    }
    const BatchRecords<Real> rec = out.records(dev);
    DeviceBuffer<Real> dW0(W0, B * D);
    // The fields the method reads, each on the device; the others stay null.
    Hyperparameters<Real> dh;
    std::vector<DeviceBuffer<Real>> dh_buffers;
    dh_buffers.reserve(kHyperparameterCount);
    for (int i = 0; i < kHyperparameterCount; ++i) {
      if (!h.field(i)) continue;
      dh_buffers.emplace_back(h.field(i), B);
      dh.field(i) = dh_buffers.back().get();
    }
    constexpr bool can_reduce = module::has_reduced<Core>::value;
    long long state_reals =
        FullSpaceState<std::decay_t<decltype(c.model)>, Real>::scratch_size(c.model);
    if constexpr (can_reduce)
      if (reduced) state_reals = SpectralState<Real>::scratch_size(c.spectral);
    const long long traj_reals = trajectory_scratch_reals(D, cfg);
    const long long jets_each = jet_scratch_size(c.model);
    const long long chunk = launch_chunk(
        B, (state_reals + traj_reals) * sizeof(Real) + jets_each * sizeof(Jet<Real, 1>));
    DeviceBuffer<Real> state(chunk * state_reals), scratch(chunk * traj_reals);
    DeviceBuffer<Jet<Real, 1>> jets(chunk * jets_each);
    for (long long first = 0; first < B; first += chunk) {
      const long long count = std::min(chunk, B - first);
      bool launched = false;
      if constexpr (can_reduce) {
        if (reduced) {
          cuda::spectral_trajectory_kernel<<<blocks_for(count), kThreads>>>(
              c.model, c.spectral, cfg, dW0.get(), dh, first, count, B,
              offset, rec, state.get(), scratch.get(), jets.get());
          launched = true;
        }
      }
      if (!launched)
        cuda::trajectory_kernel<<<blocks_for(count), kThreads>>>(
            c.model, cfg, dW0.get(), dh, first, count, B, offset, rec,
            state.get(), scratch.get(), jets.get());
      finish_launch("run");
    }
    for (std::size_t i = 0; i < arrays.size(); ++i)
      if (arrays[i]->size()) mirror[i].to(static_cast<char*>(arrays[i]->mutable_data()));
  }
};

template <class Core, class Real>
void add_methods(py::class_<Core>& cls) {
  module::bind_model<CudaExec, Core, Real>(cls);
}

// The Python classes, one function template per model.
template <class Real>
void bind_BNLinearRegression(py::module_& m, const std::string& suffix) {
  py::class_<BNLinRegCuda<Real>> cls(m, ("BNLinearRegression" + suffix).c_str());
  module::def_init_BNLinearRegression<Real>(cls);
  add_methods<BNLinRegCuda<Real>, Real>(cls);
}

template <class Real>
void bind_BNMatrixCompletion(py::module_& m, const std::string& suffix) {
  py::class_<BNMatrixCompletionCuda<Real>> cls(m, ("BNMatrixCompletion" + suffix).c_str());
  module::def_init_BNMatrixCompletion<Real>(cls);
  add_methods<BNMatrixCompletionCuda<Real>, Real>(cls);
}

template <class Real>
void bind_BNTwoLayerNet(py::module_& m, const std::string& suffix) {
  py::class_<BNTwoLayerNetCuda<Real>> cls(m, ("BNTwoLayerNet" + suffix).c_str());
  module::def_init_BNTwoLayerNet<Real>(cls);
  add_methods<BNTwoLayerNetCuda<Real>, Real>(cls);
}

template <class Real>
void bind_Toy3D(py::module_& m, const std::string& suffix) {
  py::class_<Toy3DCuda<Real>> cls(m, ("Toy3D" + suffix).c_str());
  module::def_init_Toy3D<Real>(cls);
  add_methods<Toy3DCuda<Real>, Real>(cls);
}

// One translation unit per model of builtin_models.hpp and precision: CMakeLists.txt
// generates them from bind_unit.cu.in, so that the module's heavy parts compile in
// parallel; module.cu binds them.
#define PYSHARP_CUDA_DECLARE_UNITS(Model)       \
  void bind_##Model##_f64(py::module_& m); \
  void bind_##Model##_f32(py::module_& m);
PYSHARP_BUILTIN_MODELS(PYSHARP_CUDA_DECLARE_UNITS)
#undef PYSHARP_CUDA_DECLARE_UNITS

}  // namespace pysharp::cuda_module
