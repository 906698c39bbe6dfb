// Operator: a parameter set that compiles to one tile-ISA kernel and carries an f32
// host reference of what that kernel computes.
//
// Every operator in the library follows the same life cycle (plan, then execute):
//
//   ops::Gemv gemv({.m = 2048, .k = 640, .weight = DType::kQ4_K});
//   StatusOr<ops::Kernel> k = gemv.compile(ops::Target::of(device.info()));
//   // launch k->image over k->grid blocks with buffers bound in k->args order
//
// compile() validates the parameters first; a bad parameter is a kInvalidArgument
// whose message names the operator and the parameter ("gemv: parameter 'k' ...").
// The signature (argument names, directions, dtypes and sizes) is a function of
// the parameters alone, so graphs can lay out buffers before anything is compiled.
//
// reference() runs the same computation on the host in f32 (sums in double) over
// host buffers in the kernel's argument order and dtypes; tests compare a device run
// with it by relative L2 error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/image.h"
#include "npurt/isa/isa.h"

namespace npurt::ops {

// What the device needs to run an operator: a verified image, the launch grid, and
// the arguments in kernel order (the same list as Operator::signature()).
struct Kernel {
  isa::Image image;
  uint32_t grid = 1;
  std::vector<isa::ArgSpec> args;
};

// The machine a kernel is compiled for. Operators size their tiles to fit
// `local_bytes` and, by default, split work over `cores` blocks.
struct Target {
  uint32_t cores = 8;
  uint32_t local_bytes = 256u << 10;
  static Target of(const hal::DeviceInfo& info) { return {info.num_cores, info.local_memory_bytes}; }
};

// A host-side argument of reference(): the bytes of a buffer (in the argument's
// dtype) or the raw bits of a scalar, exactly as a launch would pass them.
struct HostArg {
  std::span<uint8_t> bytes;
  uint64_t bits = 0;
  bool is_scalar = false;

  static HostArg buffer(std::span<uint8_t> b) { return {b, 0, false}; }
  static HostArg i64(int64_t v) { return {{}, static_cast<uint64_t>(v), true}; }
  static HostArg f32(float v);
  float as_f32() const;
  int64_t as_i64() const { return static_cast<int64_t>(bits); }
};

// What an operator's code generator works with: the builder to emit into, the target,
// and the kernel argument bound to each entry of the signature. compile() gives an
// operator a builder of its own; a fused sequence (graph/) gives every step the same
// builder, with arguments shared by name across steps.
struct EmitContext {
  isa::KernelBuilder& builder;
  Target target;
  std::vector<isa::ArgSpec> signature;
  std::vector<uint8_t> args;  // args[i]: kernel argument index of signature[i]

  // The kernel argument of the signature entry `name` (which must exist).
  uint8_t arg(std::string_view name) const;
};

class Operator {
 public:
  virtual ~Operator() = default;

  // The kind and shape, e.g. "gemv q4_K 262144x640"; names kernels and errors.
  virtual std::string name() const = 0;
  // kOk, or kInvalidArgument naming the first bad parameter.
  virtual Status validate() const = 0;
  // Arguments in kernel order. Meaningful only when validate() is ok.
  virtual std::vector<isa::ArgSpec> signature() const = 0;

  // Validates, emits and verifies the kernel for `target`.
  StatusOr<Kernel> compile(const Target& target = {}) const;
  // Checks `args` against the signature (count, kinds, buffer sizes), then writes the
  // reference result into every output buffer.
  Status reference(std::span<const HostArg> args) const;

  // Emits the kernel's code into ctx (parameters already validated) and returns the
  // number of blocks it needs. The code must not end with EXIT (the caller ends the
  // kernel), must set every register before reading it, and must stay within
  // kMaxLoopDepth - 1 nested loops, so that a fused sequence can run it behind a
  // one-level guard after other steps' code.
  virtual StatusOr<uint32_t> emit(EmitContext& ctx) const = 0;

  // Whether an `out` argument may be bound to exactly the same bytes as an `in`
  // argument: true when every block loads each tile completely before storing it and
  // blocks write disjoint ranges.
  virtual bool in_place_safe() const { return false; }

 protected:
  // Called by reference() with checked arguments.
  virtual void compute_reference(std::span<const HostArg> args) const = 0;
  // What reference() runs after its checks: compute_reference(), for every operator
  // whose reference cannot fail. One whose reference is supplied from outside (and
  // may fail, or be absent) reports that here.
  virtual Status reference_checked(std::span<const HostArg> args) const {
    compute_reference(args);
    return ok_status();
  }
};

// Whether an operator may run with `out` bound to the bytes of `in` (see
// Operator::in_place_safe).
enum class InPlace : uint8_t { kUnsafe, kSafe };

// The base of the library's operators: it holds the parameter struct and answers
// in_place_safe() as the operator states it (there is no default: each operator
// decides). Each operator declares its Operator overrides with
// NPURT_OPERATOR_OVERRIDES (below).
template <typename P, InPlace kInPlace>
class OperatorWith : public Operator {
 public:
  using Params = P;
  explicit OperatorWith(Params p) : p_(std::move(p)) {}
  const Params& params() const { return p_; }
  bool in_place_safe() const override { return kInPlace == InPlace::kSafe; }

 protected:
  Params p_;
};

// Declares, inside a class derived from OperatorWith, what every library operator
// has: the constructor from its parameters, the public overrides name(), validate()
// and signature(), and the protected ones emit() and compute_reference(). C++ cannot
// inherit override declarations, so one macro keeps them in step across the
// operators. It leaves the class in its protected section: members written after it
// are protected unless another access label follows.
//
//   class Gemm final : public OperatorWith<GemmParams, InPlace::kUnsafe> {
//     NPURT_OPERATOR_OVERRIDES;
//   };
#define NPURT_OPERATOR_OVERRIDES                                 \
 public:                                                         \
  using OperatorWith::OperatorWith;                              \
  std::string name() const override;                             \
  Status validate() const override;                              \
  std::vector<isa::ArgSpec> signature() const override;          \
                                                                 \
 protected:                                                      \
  StatusOr<uint32_t> emit(EmitContext& ctx) const override;      \
  void compute_reference(std::span<const HostArg> args) const override

// kInvalidArgument "<op>: parameter '<param>' <why>", the form every validate() uses.
Status invalid_param(std::string_view op, std::string_view param, std::string_view why);

// Host helpers for references: decode a buffer argument to f32 / encode f32 into it.
std::vector<float> read_f32(const HostArg& arg, isa::DType dtype);
void write_f32(const HostArg& arg, isa::DType dtype, std::span<const float> values);

}  // namespace npurt::ops
