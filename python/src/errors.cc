// Status -> Python exception. One exception class per status code, all subclasses
// of npurt.Error (a RuntimeError), each also deriving from the built-in exception a
// Python caller would naturally catch (ValueError for invalid arguments, IndexError
// for out-of-range, KeyError for not-found, ...). str(e) is the C++ message exactly.
#include <array>
#include <string>

#include "common.h"

namespace npurt::python {
namespace {

// Defined in Python so that multiple inheritance from built-in exceptions and the
// __str__ override (KeyError would otherwise quote the message) are plain Python.
constexpr const char* kErrorClasses = R"PY(
class Error(RuntimeError):
    """An error reported by the npurt runtime.

    str(e) is the runtime's message, unchanged; e.code names the status code
    (for example "INVALID_ARGUMENT")."""
    code = "UNKNOWN"

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(Error, ValueError):
    """A malformed argument: bad size, bad parameter, bad binding."""
    code = "INVALID_ARGUMENT"


class DTypeError(InvalidArgumentError, TypeError):
    """An array or buffer of the wrong element type."""
    code = "INVALID_ARGUMENT"


class OutOfRangeError(Error, IndexError):
    """An offset, index or view outside its container."""
    code = "OUT_OF_RANGE"


class NotFoundError(Error, KeyError):
    """A named object that does not exist (an unknown buffer name)."""
    code = "NOT_FOUND"


class FailedPreconditionError(Error):
    """The object's state forbids the call (a closed device, a freed buffer)."""
    code = "FAILED_PRECONDITION"


class ResourceExhaustedError(Error):
    """Device memory, local memory or slots are exhausted."""
    code = "RESOURCE_EXHAUSTED"


class DeviceFaultError(Error):
    """A kernel faulted on the device; the device stays usable."""
    code = "DEVICE_FAULT"


class HazardError(Error):
    """The simulator's sanitizer detected a coherence hazard."""
    code = "HAZARD"


class UnimplementedError(Error, NotImplementedError):
    """A valid request this build does not support."""
    code = "UNIMPLEMENTED"


class InternalError(Error):
    """An invariant of the runtime did not hold (a bug in npurt)."""
    code = "INTERNAL"
)PY";

// Indexed by StatusCode; [0] (kOk) is the base class. Leaked on purpose: the module
// holds them, and they must outlive every raise, including during shutdown.
std::array<PyObject*, 10> g_classes{};
PyObject* g_dtype_error = nullptr;

}  // namespace

void bind_errors(nb::module_& m) {
  nb::dict ns;
  ns["__builtins__"] = nb::module_::import_("builtins");
  ns["__name__"] = m.attr("__name__");
  PyObject* r = PyRun_String(kErrorClasses, Py_file_input, ns.ptr(), ns.ptr());
  if (r == nullptr) throw nb::python_error();
  Py_DECREF(r);
  const char* names[] = {"Error",
                         "InvalidArgumentError",
                         "OutOfRangeError",
                         "NotFoundError",
                         "FailedPreconditionError",
                         "ResourceExhaustedError",
                         "DeviceFaultError",
                         "HazardError",
                         "UnimplementedError",
                         "InternalError"};
  for (size_t i = 0; i < g_classes.size(); ++i) {
    nb::object cls = ns[names[i]];
    m.attr(names[i]) = cls;
    g_classes[i] = cls.release().ptr();
  }
  nb::object dtype_error = ns["DTypeError"];
  m.attr("DTypeError") = dtype_error;
  g_dtype_error = dtype_error.release().ptr();
}

void raise_status(const Status& status) {
  size_t i = static_cast<size_t>(status.code());
  if (i >= g_classes.size()) i = 0;
  PyErr_SetString(g_classes[i], status.message().c_str());
  throw nb::python_error();
}

void raise_dtype_error(const std::string& message) {
  PyErr_SetString(g_dtype_error, message.c_str());
  throw nb::python_error();
}

}  // namespace npurt::python
