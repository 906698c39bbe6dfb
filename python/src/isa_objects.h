// The C++ objects behind npurt.isa.Image (shared by isa.cc, which builds and loads
// images, ops.cc, whose Kernel.image is one and whose Custom operator takes one, and
// launch.cc, which runs one).
#pragma once

#include <string>

#include "common.h"
#include "npurt/isa/image.h"

namespace npurt::python {

struct PyImage {
  isa::Image image;
};

// The image's content hash (the code registry's XXH3-128 dedup key), 32 hex digits.
std::string image_hash_hex(const isa::Image& image);

}  // namespace npurt::python
