// The npurt._npurt extension module: errors, device, buffers and views, kernel
// images and their builder, operators (custom ones too),
// operator sequences, the worker, models and device groups. The package npurt
// re-exports it.
#include "common.h"
#include "npurt/version.h"

NB_MODULE(_npurt, m) {
  namespace py = npurt::python;
  m.doc() = "npurt: a runtime for compiled NPU operators, on its simulated NPU.";
  m.attr("__version__") = NPURT_VERSION_STRING;
  py::bind_errors(m);
  py::bind_device(m);
  py::bind_isa(m);
  py::bind_ops(m);
  py::bind_custom(m);
  py::bind_sequence(m);
  py::bind_models(m);
  py::bind_group(m);
}
