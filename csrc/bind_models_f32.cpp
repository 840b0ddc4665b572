// The scale-invariant models of pysharp._core in float (bind_models.hpp).
#include "bind_models.hpp"

namespace pysharp::module {

void bind_models_f32(py::module_& m) { bind_dtype<float>(m, "_f32"); }

}  // namespace pysharp::module
