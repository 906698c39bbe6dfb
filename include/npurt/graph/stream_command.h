// StreamCommand: a sequence step that is device work other than a kernel, such as a
// collective (comm/collective_steps.h).
//
// It binds buffers and scalars by name like an operator (its signature), so a
// sequence lays out and type-checks its buffers as for any step; fused dispatch ends
// a kernel before it and starts another after it. At run time the sequence hands it
// its arguments in signature order (views and scalar values) and it enqueues its work
// on the run's stream, through MemoryContext::enqueue_command so that coherence and
// ordering are those of a launch. Its host reference is what it does on a group of
// one rank (a sequence with collectives has no single-device reference).
#pragma once

#include <span>

#include "npurt/hal/device.h"
#include "npurt/memory/launch_arg.h"
#include "npurt/ops/operator.h"

namespace npurt::graph {

class StreamCommand : public ops::Operator {
 public:
  // Enqueues the command on `stream`; `args` follow signature().
  virtual Status enqueue(hal::StreamId stream, std::span<const LaunchArg> args) const = 0;

 protected:
  StatusOr<uint32_t> emit(ops::EmitContext&) const final { return unimplemented(name() + " is not a kernel"); }
};

// Declares, inside a StreamCommand subclass, the overrides every command defines:
// name(), validate(), signature() and enqueue() public, compute_reference()
// protected (as NPURT_OPERATOR_OVERRIDES does for operators). It leaves the class in
// its protected section.
#define NPURT_STREAM_COMMAND_OVERRIDES                                                  \
 public:                                                                                \
  std::string name() const override;                                                    \
  Status validate() const override;                                                     \
  std::vector<isa::ArgSpec> signature() const override;                                 \
  Status enqueue(hal::StreamId stream, std::span<const LaunchArg> args) const override; \
                                                                                        \
 protected:                                                                             \
  void compute_reference(std::span<const ops::HostArg> args) const override

}  // namespace npurt::graph
