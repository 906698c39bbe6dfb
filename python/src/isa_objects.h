// The C++ objects behind npurt.isa.Image (shared by isa.cc, which builds and loads
// images, ops.cc, whose Kernel.image is one and whose Custom operator takes one, and
// launch.cc, which runs one).
#pragma once

#include "common.h"
#include "npurt/isa/image.h"

namespace npurt::python {

struct PyImage {
  isa::Image image;
};

}  // namespace npurt::python
