// pybind11 module pysharp._cuda: the CUDA kernels behind the interface of pysharp._core.
//
// Each model class takes the same constructor arguments and offers the same
// methods (loss_grad, hvp, third, hessian, lanczos, run) as its CPU twin, so
// the Python layer dispatches to either without knowing which it holds.
// Inputs are host arrays, copied to the device once per call; results come
// back as NumPy arrays. The module imports without a GPU (the CUDA runtime is
// linked statically); device_error() says whether kernels can run.
#include <string>

#include "cuda/executor.cuh"

namespace py = pybind11;
using namespace pysharp;

namespace pysharp::cuda_module {
void bind_tile(py::module_& m);  // bind_tile.cu: the fused tile kernels (_tile_*)
}

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "pysharp CUDA kernels, with the interface of pysharp._core (see pysharp.backends).";
#define PYSHARP_CUDA_BIND_UNITS(Model) \
  cuda_module::bind_##Model##_f64(m);  \
  cuda_module::bind_##Model##_f32(m);
  PYSHARP_BUILTIN_MODELS(PYSHARP_CUDA_BIND_UNITS)
#undef PYSHARP_CUDA_BIND_UNITS
  cuda_module::bind_tile(m);
  m.attr("METHODS") = module::method_names();
  m.attr("RECORDS") = module::record_table<double>();
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
    cuda_module::check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_module::check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    info["name"] = std::string(p.name);
    info["compute_capability"] = std::to_string(p.major) + "." + std::to_string(p.minor);
    info["multiprocessors"] = p.multiProcessorCount;
    info["memory_bytes"] = static_cast<long long>(p.totalGlobalMem);
    return info;
  });
}
