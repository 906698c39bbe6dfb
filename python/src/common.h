// Shared pieces of the npurt Python extension: the device state every Python object
// holds, status -> exception conversion, dtype handling and numpy views of mirrors.
//
// Lifetimes. A Python Device owns a DeviceState, which owns an npurt::Runtime (the
// simulated device, its memory context, code registry and streams). Every object
// created from it holds the same DeviceState, and the C++ objects behind them keep
// what they use alive themselves, so Python objects may go in any order.
// Device.close() closes the runtime: workers drain, streams go, every buffer is freed.
// Afterwards every operation reports "device is closed"; memory that numpy arrays
// point into (host mirrors) stays mapped until the last view goes.
//
// Closing and the GIL. Runtime::close() is safe against calls racing with it on any
// object (they finish first or fail), so the module takes no lock of its own around
// calls: close() sets `closed` (later calls fail at once as "device is closed"), then
// closes the runtime; a call it overtook fails inside the runtime, and device_call
// names that failure the same way. Calls run with the GIL released.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/isa.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"

namespace npurt::python {

namespace nb = nanobind;

// ---- errors -----------------------------------------------------------------------

// Raises the npurt exception for `status` (which must be an error); its str() is
// exactly status.message() and its `code` the status code's name.
[[noreturn]] void raise_status(const Status& status);
inline void check(const Status& status) {
  if (!status.ok()) raise_status(status);
}
template <typename T>
T take(StatusOr<T> value) {
  if (!value.ok()) raise_status(value.status());
  return std::move(value).value();
}
// npurt.DTypeError (an InvalidArgumentError and a TypeError): a Python-side dtype
// mismatch, which has no Status of its own.
[[noreturn]] void raise_dtype_error(const std::string& message);

void bind_errors(nb::module_& m);

// str(obj) as a std::string.
inline std::string py_str(nb::handle obj) {
  nb::object s = nb::steal(PyObject_Str(obj.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return nb::cast<std::string>(s);
}

// ---- device state -----------------------------------------------------------------

struct LaunchCache;  // custom.cc
std::shared_ptr<LaunchCache> make_launch_cache();
void clear_launch_cache(LaunchCache& cache);

struct DeviceState {
  DeviceState();
  ~DeviceState();

  std::atomic<bool> closed{false};
  std::shared_ptr<Runtime> runtime;  // set once, before the state is shared
  // Device.launch's compiled runs, so repeating one reuses its code and stream.
  const std::shared_ptr<LaunchCache> launches;

  MemoryContext& memory() const { return runtime->memory(); }
  // Closes the runtime, waiting for its work; every caller returns once it is
  // closed. Must be called with the GIL released. Idempotent.
  void close();

 private:
  std::once_flag close_once_;
};

Status closed_error();

// A DeviceState over a runtime made elsewhere (a device group's), closed at
// interpreter exit like those of npurt.Device().
std::shared_ptr<DeviceState> adopt_runtime(std::shared_ptr<Runtime> runtime);

// Refusals of a call that raced with close() (the runtime's, in its own words) become
// "device is closed", as for calls made after it.
inline Status name_closed(const DeviceState& st, Status s) {
  if (s.code() == StatusCode::kFailedPrecondition && st.closed) return closed_error();
  return s;
}

// Runs f() (returning Status) with the GIL released; "device is closed" when it is.
// Raises the resulting error.
template <typename F>
void device_call(DeviceState& st, F&& f) {
  Status s;
  {
    nb::gil_scoped_release release;
    s = st.closed ? closed_error() : name_closed(st, f());
  }
  check(s);
}

// device_call for an f() that cannot fail itself: returns what f() returns, if anything.
template <typename F>
auto device_run(DeviceState& st, F&& f) {
  using R = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<R>) {
    device_call(st, [&] {
      f();
      return ok_status();
    });
  } else {
    R value{};
    device_call(st, [&] {
      value = f();
      return ok_status();
    });
    return value;
  }
}

// Runs f() with the GIL released when the calling thread holds it (destructors).
template <typename F>
void without_gil(F&& f) {
  if (PyGILState_Check()) {
    nb::gil_scoped_release release;
    f();
  } else {
    f();
  }
}

// ---- dtypes -------------------------------------------------------------------------

// Accepts npurt names ("f32", "bf16", "q8_0", ...), numpy names ("float32",
// "bfloat16", ...), numpy dtypes and scalar types (np.float32, ml_dtypes.bfloat16).
// Raises DTypeError for anything else.
isa::DType parse_dtype(nb::handle obj);
// The numpy dtype of .data for `t`: float32, bfloat16 (ml_dtypes), float16, int32,
// or uint8 bytes for the quantized block types.
nb::object numpy_dtype(isa::DType t);
// "float32", "bfloat16", ..., "q8_0 blocks (uint8)".
std::string dtype_description(isa::DType t);
// Bytes of `count` elements; DTypeError-free: InvalidArgument Status when `count`
// is not whole blocks of a quantized type.
StatusOr<uint64_t> element_bytes(isa::DType t, uint64_t count, const std::string& what);
// Elements of `bytes` bytes of `t` (whole blocks for quantized types).
uint64_t element_count(isa::DType t, uint64_t bytes);

// A numpy array over `bytes` bytes at `data` holding elements of `t` in `shape`
// (1-D when empty; quantized types: 1-D uint8 over the bytes). Zero-copy; `owner`
// is kept alive by the array.
nb::object mirror_array(uint8_t* data, uint64_t bytes, isa::DType t, const std::vector<size_t>& shape,
                        nb::handle owner);

// Shapes given as an int or a sequence of ints.
std::vector<size_t> parse_shape(nb::handle obj, const std::string& what);
uint64_t shape_count(const std::vector<size_t>& shape);
nb::tuple shape_tuple(const std::vector<size_t>& shape);

// ---- bindings -----------------------------------------------------------------------

void bind_device(nb::module_& m);
void bind_isa(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_custom(nb::module_& m);
void bind_sequence(nb::module_& m);
void bind_models(nb::module_& m);
void bind_group(nb::module_& m);

}  // namespace npurt::python
