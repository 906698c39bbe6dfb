// Collectives as steps of an operator sequence (graph/stream_command.h): a sequence
// per rank, each step run on the call's stream between the kernels around it.
//
//   steps.push_back({std::make_shared<comm::AllReduceStep>(comm, DType::kF32, 640), {"a"}});
#pragma once

#include <memory>
#include <utility>

#include "npurt/comm/communicator.h"
#include "npurt/graph/stream_command.h"

namespace npurt::comm {

// What every collective step holds: the group it runs over and the dtype and count
// of the elements each rank contributes.
class CollectiveStep : public graph::StreamCommand {
 public:
  CollectiveStep(std::shared_ptr<Communicator> comm, isa::DType dtype, uint64_t elements)
      : comm_(std::move(comm)), dtype_(dtype), elements_(elements) {}

 protected:
  std::shared_ptr<Communicator> comm_;
  isa::DType dtype_;
  uint64_t elements_;
};

// Sums "data" (inout, `elements` of f32 or bf16) over the group. With `row_elems`,
// "data" is rows of row_elems elements and the i32 scalar "rows" (last argument) says
// how many leading rows a call sums (batched prefill). Reference: a group of one.
class AllReduceStep final : public CollectiveStep {
 public:
  AllReduceStep(std::shared_ptr<Communicator> comm, isa::DType dtype, uint64_t elements, uint64_t row_elems = 0);
  NPURT_STREAM_COMMAND_OVERRIDES;

 private:
  uint64_t row_elems_;
};

// "gathered" (out, size() x `elements`) receives every rank's "local" (in, `elements`
// of `dtype`) in rank order. Reference: a group of one (only this rank's part).
class AllGatherStep final : public CollectiveStep {
 public:
  using CollectiveStep::CollectiveStep;
  NPURT_STREAM_COMMAND_OVERRIDES;
};

}  // namespace npurt::comm
