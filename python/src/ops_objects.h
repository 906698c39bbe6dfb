// The C++ objects behind npurt.Operator and npurt.Arg (shared by ops.cc and
// sequence.cc, which binds operators into steps).
#pragma once

#include <memory>
#include <string>

#include "common.h"
#include "npurt/ops/operator.h"

namespace npurt::python {

struct PyOperator {
  std::shared_ptr<const ops::Operator> op;
};

struct PyArg {
  std::string name;
  std::string kind;       // "buffer" or "scalar"
  std::string access;     // "in", "out", "inout"
  std::string type_name;  // npurt dtype name
  uint64_t elements = 0;
};

PyArg make_arg(const isa::ArgSpec& a);

}  // namespace npurt::python
