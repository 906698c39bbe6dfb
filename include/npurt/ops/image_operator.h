// ImageOperator: an operator whose code is a kernel image made outside the library
// (a Python-built kernel, an assembled file), so it runs wherever library operators
// do: compiled alone, as a step of a fused or separate OperatorSequence, published
// and deduplicated by content like any other code.
//
//   ImageOperator op({.image = *image, .grid = 8, .elements = {{"x", 4096}, {"y", 4096}}});
//
// The image's arguments are the signature; `elements` gives each buffer argument's
// element count, which an image does not record. Its code is replayed into whatever
// builder the operator is emitted into: argument operands are renumbered to the
// kernel's arguments, loops re-targeted, the constant section appended to the
// kernel's (a constant load whose offset register would then be wrong is moved by the
// section's new offset around that one instruction), and the local memory the image
// declares reserved. Compiled alone, a kernel built by KernelBuilder comes back with
// exactly its own bytes.
//
// Fused steps run to the end of their code, so the image may EXIT only as its last
// instruction; validate() names any other EXIT.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "npurt/ops/operator.h"

namespace npurt::ops {

// Writes every output of `args` (signature order) from the inputs; an error Status
// is reported by reference() as is.
using ReferenceFn = std::function<Status(std::span<const HostArg> args)>;

struct ImageOperatorParams {
  isa::Image image;
  uint32_t grid = 1;                                     // blocks of a launch
  std::map<std::string, uint64_t, std::less<>> elements;  // per buffer argument
  ReferenceFn reference;                                 // empty: reference() is kUnimplemented
};

class ImageOperator final : public OperatorWith<ImageOperatorParams, InPlace::kUnsafe> {
  NPURT_OPERATOR_OVERRIDES;
  Status reference_checked(std::span<const HostArg> args) const override;
};

}  // namespace npurt::ops
