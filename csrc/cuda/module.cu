// pybind11 module pysharp._cuda: the CUDA kernels behind the interface of pysharp._core.
//
// Each model class takes the same constructor arguments and offers the same
// methods (loss_grad, hvp, third, hessian, lanczos, run) as its CPU twin, so
// the Python layer dispatches to either without knowing which it holds.
// Inputs are host arrays, copied to the device once per call; results come
// back as NumPy arrays. The module imports without a GPU (the CUDA runtime is
// linked statically); device_error() says whether kernels can run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/kernels.cuh"
#include "module_options.hpp"

namespace py = pybind11;
using namespace pysharp;

template <class T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;
using flags = py::array_t<std::uint8_t>;

namespace {

constexpr int kThreads = 128;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

using module::lanczos_options;
using module::require;

int blocks_for(long long n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

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

void finish_launch(const char* what) {
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

template <class Core>
long long checked_batch(const Core& core, const py::array& W, const char* name) {
  require(W.ndim() == 2 && W.shape(1) == core.model.dim(),
          std::string(name) + " must be (B, " + std::to_string(core.model.dim()) + ")");
  return W.shape(0);
}


// How many trajectories one launch runs: bounded by a quarter of free device memory.
long long launch_chunk(long long B, long long bytes_each) {
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  const long long cap = std::max<long long>(1, static_cast<long long>(free_b / 4) /
                                                   std::max<long long>(1, bytes_each));
  return std::min(B, cap);
}

template <class Core, class Real>
void add_methods(py::class_<Core>& cls) {
  cls.def_property_readonly("dim", [](const Core& c) { return c.model.dim(); });
  cls.def("loss_grad", [](const Core& c, const carray<Real>& W) {
    const long long B = checked_batch(c, W, "W");
    const int D = c.model.dim();
    auto dW = DeviceBuffer<Real>::from(W);
    DeviceBuffer<Real> dl(B), dG(B * D), work(B * std::max(1, c.model.work_size()));
    DeviceBuffer<std::uint8_t> dok(B);
    {
      py::gil_scoped_release nogil;
      cuda::loss_grad_kernel<<<blocks_for(B), kThreads>>>(c.model, dW.get(), B, dl.get(),
                                                         dG.get(), work.get(), dok.get());
      finish_launch("loss_grad");
    }
    carray<Real> loss(B), G({B, static_cast<long long>(D)});
    flags ok(B);
    dl.to(loss.mutable_data());
    dG.to(G.mutable_data());
    dok.to(ok.mutable_data());
    return py::make_tuple(loss, G, ok);
  }, py::arg("W"));
  auto directional = [](auto order) {
    return [](const Core& c, const carray<Real>& W, const carray<Real>& V) {
      constexpr int N = decltype(order)::value;
      const long long B = checked_batch(c, W, "W");
      require(checked_batch(c, V, "V") == B, "W and V must have the same shape");
      const int D = c.model.dim();
      auto dW = DeviceBuffer<Real>::from(W);
      auto dV = DeviceBuffer<Real>::from(V);
      DeviceBuffer<Real> dout(B * D);
      DeviceBuffer<Jet<Real, N>> jets(B * jet_scratch_size(c.model));
      DeviceBuffer<std::uint8_t> dok(B);
      {
        py::gil_scoped_release nogil;
        cuda::directional_kernel<N><<<blocks_for(B), kThreads>>>(
            c.model, dW.get(), dV.get(), B, dout.get(), jets.get(), dok.get());
        finish_launch(N == 1 ? "hvp" : "third");
      }
      carray<Real> out({B, static_cast<long long>(D)});
      flags ok(B);
      dout.to(out.mutable_data());
      dok.to(ok.mutable_data());
      return py::make_tuple(out, ok);
    };
  };
  cls.def("hvp", directional(std::integral_constant<int, 1>{}), py::arg("W"), py::arg("V"));
  cls.def("third", directional(std::integral_constant<int, 2>{}), py::arg("W"), py::arg("V"));
  cls.def("hessian", [](const Core& c, const carray<Real>& W) {
    const long long B = checked_batch(c, W, "W");
    const long long D = c.model.dim();
    auto dW = DeviceBuffer<Real>::from(W);
    DeviceBuffer<Real> dH(B * D * D), e(B * D * D), col(B * D * D);
    DeviceBuffer<Jet<Real, 1>> jets(B * D * jet_scratch_size(c.model));
    DeviceBuffer<std::uint8_t> bad(B);
    bad.fill_zero();
    {
      py::gil_scoped_release nogil;
      cuda::hessian_kernel<<<blocks_for(B * D), kThreads>>>(c.model, dW.get(), B, dH.get(),
                                                           e.get(), col.get(), jets.get(),
                                                           bad.get());
      finish_launch("hessian");
    }
    carray<Real> H({B, D, D});
    flags ok(B);
    dH.to(H.mutable_data());
    bad.to(ok.mutable_data());
    for (long long b = 0; b < B; ++b) ok.mutable_data()[b] = !ok.data()[b];
    return py::make_tuple(H, ok);
  }, py::arg("W"));
  cls.def("lanczos", [](const Core& c, const carray<Real>& W, int k, int max_iter, int min_iter,
                        double tol, std::uint64_t seed, std::optional<carray<Real>> start,
                        bool smallest) {
    const long long B = checked_batch(c, W, "W");
    const int D = c.model.dim();
    const LanczosOptions o = lanczos_options(D, k, max_iter, min_iter, tol, seed, smallest);
    if (start) require(checked_batch(c, *start, "start") == B, "start must match W");
    auto dW = DeviceBuffer<Real>::from(W);
    DeviceBuffer<Real> dS = start ? DeviceBuffer<Real>::from(*start) : DeviceBuffer<Real>();
    DeviceBuffer<Real> dev(B * k), dvec(B * k * D), dres(B * k);
    DeviceBuffer<Real> scratch(B * lanczos_scratch_size(D, o));
    DeviceBuffer<Jet<Real, 1>> jets(B * jet_scratch_size(c.model));
    DeviceBuffer<int> dit(B);
    DeviceBuffer<std::uint8_t> dconv(B), dok(B);
    {
      py::gil_scoped_release nogil;
      cuda::lanczos_kernel<<<blocks_for(B), kThreads>>>(
          c.model, o, dW.get(), start ? dS.get() : nullptr, B, dev.get(), dvec.get(),
          dres.get(), dit.get(), dconv.get(), dok.get(), scratch.get(), jets.get());
      finish_launch("lanczos");
    }
    carray<Real> evals({B, (long long)k}), evecs({B, (long long)k, (long long)D}),
        resid({B, (long long)k});
    py::array_t<int> iters(B);
    flags conv(B), ok(B);
    dev.to(evals.mutable_data());
    dvec.to(evecs.mutable_data());
    dres.to(resid.mutable_data());
    dit.to(iters.mutable_data());
    dconv.to(conv.mutable_data());
    dok.to(ok.mutable_data());
    return py::make_tuple(evals, evecs, resid, iters, conv, ok);
  }, py::arg("W"), py::arg("k"), py::arg("max_iter"), py::arg("min_iter"), py::arg("tol"),
     py::arg("seed"), py::arg("start") = py::none(), py::arg("smallest") = false);
  cls.def("run", [](const Core& c, const carray<Real>& W0, const carray<Real>& lr,
                    const carray<Real>& wd, int method, long long steps, long long record_every,
                    long long sharpness_every, long long theta_every, double jitter,
                    std::uint64_t seed, long long offset, double rms_beta, double rms_eps,
                    int lanczos_max_iter, int lanczos_min_iter, double lanczos_tol,
                    bool reduced) {
    const long long B = checked_batch(c, W0, "w0");
    const int D = c.model.dim();
    require(lr.size() == B && wd.size() == B, "lr and wd must have one entry per trajectory");
    constexpr bool has_reduced = std::is_same_v<Core, BNLinRegCuda<Real>>;
    const EngineConfig cfg = module::engine_config(
        D, method, steps, record_every, sharpness_every, theta_every, jitter, seed, rms_beta,
        rms_eps, lanczos_max_iter, lanczos_min_iter, lanczos_tol, reduced, has_reduced);
    const long long nrec = n_records(steps, record_every), nsh = n_records(steps, sharpness_every),
                    nth = n_records(steps, theta_every);
    DeviceBuffer<Real> loss(nrec * B), norm2(nrec * B), eff(nrec * B), gn(nrec * B),
        top(sharpness_every ? nrec * B : 0), sharp(nsh * B), ratio(nsh * B), theta(nth * B * D),
        w(B * D);
    DeviceBuffer<std::uint8_t> sconv(nsh * B), div(B);
    DeviceBuffer<long long> divs(B);
    const int G = n_groups(c.model);
    DeviceBuffer<Real> groups(G > 1 ? nrec * B * G : 0);
    BatchRecords<Real> out{loss.get(), norm2.get(), eff.get(), gn.get(),
                           sharpness_every ? top.get() : nullptr, sharp.get(), ratio.get(),
                           sconv.get(), nth ? theta.get() : nullptr, w.get(), div.get(),
                           divs.get(), G > 1 ? groups.get() : nullptr, G};
    auto dW0 = DeviceBuffer<Real>::from(W0);
    auto dlr = DeviceBuffer<Real>::from(lr);
    auto dwd = DeviceBuffer<Real>::from(wd);
    long long state_reals = FullSpaceState<std::decay_t<decltype(c.model)>, Real>::scratch_size(c.model);
    if constexpr (has_reduced)
      if (reduced) state_reals = SpectralState<Real>::scratch_size(c.spectral);
    const long long traj_reals = trajectory_scratch_reals(D, cfg);
    const long long jets_each = jet_scratch_size(c.model);
    const long long chunk = launch_chunk(
        B, (state_reals + traj_reals) * sizeof(Real) + jets_each * sizeof(Jet<Real, 1>));
    DeviceBuffer<Real> state(chunk * state_reals), scratch(chunk * traj_reals);
    DeviceBuffer<Jet<Real, 1>> jets(chunk * jets_each);
    {
      py::gil_scoped_release nogil;
      for (long long first = 0; first < B; first += chunk) {
        const long long count = std::min(chunk, B - first);
        bool launched = false;
        if constexpr (has_reduced) {
          if (reduced) {
            cuda::spectral_trajectory_kernel<<<blocks_for(count), kThreads>>>(
                c.model, c.spectral, cfg, dW0.get(), dlr.get(), dwd.get(), first, count, B,
                offset, out, state.get(), scratch.get(), jets.get());
            launched = true;
          }
        }
        if (!launched)
          cuda::trajectory_kernel<<<blocks_for(count), kThreads>>>(
              c.model, cfg, dW0.get(), dlr.get(), dwd.get(), first, count, B, offset, out,
              state.get(), scratch.get(), jets.get());
        finish_launch("run");
      }
    }
    carray<Real> h_loss({nrec, B}), h_norm2({nrec, B}), h_eff({nrec, B}), h_gn({nrec, B}),
        h_top({sharpness_every ? nrec : 0, B}), h_sharp({nsh, B}), h_ratio({nsh, B}),
        h_theta({nth, B, (long long)D}), h_w({B, (long long)D});
    flags h_sconv({nsh, B}), h_div(B);
    py::array_t<long long> h_divs(B);
    loss.to(h_loss.mutable_data());
    norm2.to(h_norm2.mutable_data());
    eff.to(h_eff.mutable_data());
    gn.to(h_gn.mutable_data());
    top.to(h_top.mutable_data());
    sharp.to(h_sharp.mutable_data());
    ratio.to(h_ratio.mutable_data());
    theta.to(h_theta.mutable_data());
    w.to(h_w.mutable_data());
    sconv.to(h_sconv.mutable_data());
    div.to(h_div.mutable_data());
    divs.to(h_divs.mutable_data());
    py::dict r;
    r["loss"] = h_loss;
    r["norm2"] = h_norm2;
    r["eff_lr"] = h_eff;
    r["grad_norm"] = h_gn;
    r["top_grad"] = h_top;
    r["sharpness"] = h_sharp;
    r["eos_ratio"] = h_ratio;
    r["sharpness_converged"] = h_sconv;
    r["theta"] = h_theta;
    r["w"] = h_w;
    r["diverged"] = h_div;
    r["diverged_step"] = h_divs;
    if (G > 1) {
      carray<Real> h_groups({nrec, B, (long long)G});
      groups.to(h_groups.mutable_data());
      r["group_norm2"] = h_groups;
    }
    return r;
  }, py::arg("w0"), py::arg("lr"), py::arg("wd"), py::arg("method"), py::arg("steps"),
     py::arg("record_every"), py::arg("sharpness_every"), py::arg("theta_every"),
     py::arg("jitter"), py::arg("seed"), py::arg("offset"), py::arg("rms_beta"),
     py::arg("rms_eps"), py::arg("lanczos_max_iter"), py::arg("lanczos_min_iter"),
     py::arg("lanczos_tol"), py::arg("reduced") = false);
}

template <class Real>
void bind_dtype(py::module_& m, const std::string& suffix) {
  py::class_<BNLinRegCuda<Real>> linreg(m, ("BNLinearRegression" + suffix).c_str());
  linreg.def(py::init<const carray<Real>&, const carray<Real>&, double, const carray<Real>&,
                      const carray<Real>&, const carray<Real>&, double>(),
             py::arg("Xc"), py::arg("u"), py::arg("scale"), py::arg("sigma"), py::arg("ut"),
             py::arg("V"), py::arg("uperp2"));
  add_methods<BNLinRegCuda<Real>, Real>(linreg);
  py::class_<BNMatrixCompletionCuda<Real>> mc(m, ("BNMatrixCompletion" + suffix).c_str());
  mc.def(py::init<const carray<int>&, const carray<int>&, const carray<Real>&, double, int, int,
                  int>(),
         py::arg("rows"), py::arg("cols"), py::arg("u"), py::arg("scale"), py::arg("m1"),
         py::arg("m2"), py::arg("rank"));
  add_methods<BNMatrixCompletionCuda<Real>, Real>(mc);
  py::class_<BNTwoLayerNetCuda<Real>> bn2(m, ("BNTwoLayerNet" + suffix).c_str());
  bn2.def(py::init<const carray<Real>&, const carray<Real>&, int, int>(), py::arg("Xc"),
          py::arg("y"), py::arg("width"), py::arg("activation"));
  add_methods<BNTwoLayerNetCuda<Real>, Real>(bn2);
  py::class_<Toy3DCuda<Real>> toy(m, ("Toy3D" + suffix).c_str());
  toy.def(py::init<double>(), py::arg("c"));
  add_methods<Toy3DCuda<Real>, Real>(toy);
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "pysharp CUDA kernels, with the interface of pysharp._core (see pysharp.backends).";
  bind_dtype<double>(m, "_f64");
  bind_dtype<float>(m, "_f32");
  m.def("device_error", []() -> std::string {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    if (n == 0) return "no CUDA device";
    return "";
  }, "Empty when a CUDA device can run the kernels, else the reason.");
  m.def("device_info", []() {
    py::dict info;
    int dev = 0;
    cudaDeviceProp p{};
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    info["name"] = std::string(p.name);
    info["compute_capability"] = std::to_string(p.major) + "." + std::to_string(p.minor);
    info["multiprocessors"] = p.multiProcessorCount;
    info["memory_bytes"] = static_cast<long long>(p.totalGlobalMem);
    return info;
  });
}
