// The C++ objects behind npurt.Buffer and npurt.View (shared by device.cc and
// sequence.cc, whose get_buffer() hands out Views too).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"
#include "npurt/memory/buffer.h"

namespace npurt::python {

struct PyDevice {
  std::shared_ptr<DeviceState> state;
};

// A Buffer's device allocation, released by Device.close(), Buffer.free() or when
// the last Python object using it goes.
class BufferResource {
 public:
  BufferResource(std::shared_ptr<DeviceState> state, Buffer buffer);
  ~BufferResource();
  void release();

  const std::shared_ptr<DeviceState> state;
  Buffer buffer;  // free() guarded by mu_

 private:
  std::mutex mu_;
};

struct PyView {
  std::shared_ptr<DeviceState> state;
  View view;
  isa::DType dtype = isa::DType::kF32;
  std::vector<size_t> shape;  // of .data; empty: 1-D
  std::string name;
  uint64_t element_offset = 0;
  // What the view came from (a Buffer or an OperatorSequence): kept alive with it,
  // and so by every array over it.
  nb::object parent;

  // The array over `v`'s mirror bytes, owned by `owner`, after fetching the view's
  // device-newer bytes.
  static nb::object data_of(nb::handle owner, PyView& v);
  nb::tuple shape_or_count() const;
};

struct PyBuffer {
  PyView whole;  // the whole buffer (parent unset: the Buffer itself owns arrays)
  std::shared_ptr<BufferResource> resource;
};

struct PyImage;
// Device.launch (custom.cc): one run of `image` over `grid` blocks, its arguments by
// name (Buffers or Views, ints or floats).
void device_launch(PyDevice& d, const PyImage& image, uint32_t grid, nb::kwargs kwargs);

}  // namespace npurt::python
