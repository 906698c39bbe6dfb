// OperatorSequence: operators bound to named buffers, laid out in three arenas and
// dispatched as one fused launch or one launch per step.
//
//   auto gate = std::make_shared<ops::Gemv>(ops::GemvParams{.m = 2048, .k = 640, ...});
//   graph::OperatorSequence seq("swiglu",
//       {{gate, {"w_gate", "x", "left"}}, {up, {"w_up", "x", "right"}}, ...},
//       /*inputs=*/{"x"}, /*outputs=*/{"y"},
//       /*buffer_sizes (elements)=*/{{"x", 640}, {"w_gate", 2048 * 640}, ...},
//       graph::Dispatch::kFused);
//   StatusOr<std::unique_ptr<graph::CompiledSequence>> run = seq.compile(runtime);
//   np.copyto-style writes: (*run)->get_buffer("x")->data(), guards, ...
//   Status s = (*run)->call({{"pos", 7}});
//
// Bindings. Step i binds one name per argument of its operator's signature, in
// order: buffer names for buffers ("x", or a slice "kv[256:512]" in elements of the
// buffer's dtype) and scalar names for scalars ("pos"), whose values are given per
// call; no name may be both. A buffer's dtype is that of the arguments bound to it (all must agree) and
// its size, in elements, is given in `buffer_sizes`; a binding's element count must
// equal the argument's.
//
// Arenas. Buffers live in three device buffers: inputs (the `inputs` names), outputs
// (the `outputs` names) and scratch (everything else: weights, caches and
// intermediates). A scratch buffer that some step writes before any step reads it
// (an intermediate) shares space with other intermediates whose lifetimes (first to
// last step using them) do not overlap; every other scratch buffer keeps its own
// bytes, so weights and caches written once through get_buffer() stay resident.
// The input and scratch arenas are tracked (memory_context.h): any host write to
// their views, by guard or raw pointer, is uploaded before the next call.
//
// Dispatch. kFused compiles every step into one kernel image: each step's code runs
// on the blocks it needs and a BARRIER separates steps, so a step sees all writes of
// its predecessors; one launch per call. A sequence with more distinct bindings than
// a kernel has arguments (isa::kMaxArgs) is cut into runs of consecutive steps, each
// one fused kernel: as few launches as the limit allows. kSeparate compiles each operator on its own;
// one launch per step, buffers shared by name. Both give identical bytes.
//
// In-place steps. A step may bind an output to exactly the bytes of one of its inputs
// only if the operator declares it safe (Operator::in_place_safe); any other overlap
// between an output and another argument of the same step is rejected at compile().
// Across steps, overlapping slices are fine: launches and barriers order them.
//
// Stream commands. A step whose operator is a graph::StreamCommand (a collective) is
// not compiled: it ends the fused kernel before it, and each call enqueues it on the
// call's stream between the kernels around it.
//
// Errors from compile() name the step (index and operator) and the binding: unknown
// buffer, dtype or size mismatch, slice out of range, bad overlap, an input written
// by a step, a missing size, a name bound both as a buffer and as a scalar.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/graph/stream_command.h"
#include "npurt/memory/memory_context.h"
#include "npurt/ops/operator.h"
#include "npurt/runtime/runtime.h"

namespace npurt::graph {

struct SequenceStep {
  std::shared_ptr<const ops::Operator> op;
  std::vector<std::string> bindings;  // one per signature argument, in order
};

enum class Dispatch : uint8_t { kFused, kSeparate };

// A runtime scalar given per call; converted to the argument's declared type: an f32
// argument takes either kind, an integer one only an integer (a floating value is
// refused by call(), enqueue() and run_reference() alike).
using ScalarValue = std::variant<int64_t, double>;
using Scalars = std::map<std::string, ScalarValue, std::less<>>;

class CompiledSequence;

// Fused steps get a barrier only where a step touches bytes a step since the last
// barrier writes, or writes bytes one reads. Hazard::kNoStepBarriers (base/hazards.h)
// is the wrong plan tests use: no barrier between fused steps at all, so a step may
// read bytes other blocks have not written yet.
struct CompileOptions {
  // Buffers this sequence binds but does not own: name -> a view of another owner's
  // buffer in the same memory context (say, another sequence's weights and KV cache),
  // of exactly the bytes `buffer_sizes` gives the name. They get no arena space;
  // coherence and ordering are the memory context's, as for any view.
  std::map<std::string, View, std::less<>> shared = {};
};

class OperatorSequence {
 public:
  OperatorSequence(std::string name, std::vector<SequenceStep> steps, std::vector<std::string> inputs,
                   std::vector<std::string> outputs, std::map<std::string, uint64_t> buffer_sizes,
                   Dispatch dispatch = Dispatch::kFused);

  // Lays out the arenas (allocating them in the runtime's memory context), compiles and
  // publishes the code through its registry. The result keeps the runtime alive.
  StatusOr<std::unique_ptr<CompiledSequence>> compile(Runtime& runtime, CompileOptions options = {}) const;

  const std::string& name() const { return name_; }

  // Runs every step's host reference in order over `buffers` (name -> bytes in the
  // buffer's dtype; missing buffers are created zero-filled, so pass at least the
  // inputs and the resident scratch buffers). The host mirror of a call, for tests;
  // `scalars` as for CompiledSequence::call (an unknown name is an error).
  Status run_reference(std::map<std::string, std::vector<uint8_t>>& buffers, const Scalars& scalars = {}) const;

 private:
  std::string name_;
  std::vector<SequenceStep> steps_;
  std::vector<std::string> inputs_, outputs_;
  std::map<std::string, uint64_t> sizes_;
  Dispatch dispatch_;
};

// Where compile() placed one buffer.
struct BufferPlacement {
  std::string name;
  enum class Arena : uint8_t { kInput, kOutput, kScratch } arena = Arena::kScratch;
  uint64_t offset = 0;  // bytes into the arena
  uint64_t bytes = 0;
  isa::DType dtype = isa::DType::kF32;
  bool intermediate = false;  // shares space with intermediates of disjoint lifetime
};

// One thread at a time calls a CompiledSequence; host writes to its views may come
// from any thread (they are tracked) as long as they happen-before the call.
class CompiledSequence {
 public:
  ~CompiledSequence();
  CompiledSequence(const CompiledSequence&) = delete;
  CompiledSequence& operator=(const CompiledSequence&) = delete;

  // A view of buffer `name` (or of a slice "name[a:b]") in its arena.
  StatusOr<View> get_buffer(std::string_view name) const;

  // Uploads exactly the stale bytes of what the steps read, runs the steps, then
  // brings back exactly the output buffers (synchronous). `scalars` must give every
  // scalar the steps bind, and nothing else (scalar_names()). Runs on a stream of the
  // sequence's own pool (exec/stream_pool.h): reused while no code was published, fresh
  // and primed over every core otherwise, replaced after a failure. After the runtime
  // closed, every call fails naming the sequence.
  Status call(const Scalars& scalars = {});
  // call() in two halves, for a caller that drives several devices at once (their
  // collectives meet on the devices' streams): start() acquires the stream and
  // enqueues the run (on an error it returns the stream and the error); after a
  // successful start(), finish() waits for the run, then brings back the outputs.
  Status start(const Scalars& scalars = {});
  Status finish();

  // The asynchronous part of call(): the uploads and launches, enqueued on `stream`
  // (e.g. a Worker run's stream; its code handles are code_handles()). Outputs are
  // then device-newer and come back on the next host read of their views.
  Status enqueue(hal::StreamId stream, const Scalars& scalars = {});
  // The names of the scalars the steps bind, sorted. call(), start(), enqueue() and
  // run_reference() refuse a name that is not one of them (check_scalars: the error
  // names the unknown ones and lists these), so a misspelled scalar never goes unused.
  const std::vector<std::string>& scalar_names() const { return scalars_; }
  Status check_scalars(const Scalars& scalars) const;
  // Every image a run launches, for exec::Worker::submit.
  const std::vector<exec::CodeHandle>& code_handles() const { return code_; }

  Dispatch dispatch() const { return dispatch_; }
  size_t launches_per_call() const;
  // BARRIER instructions a call's kernels hold: the phases every block waits between
  // (fused steps that touch each other's bytes, and operators' own).
  size_t barriers_per_call() const;
  const std::vector<BufferPlacement>& placements() const { return placements_; }
  // Arena sizes in bytes: input, output, scratch.
  uint64_t arena_bytes(BufferPlacement::Arena arena) const;

 private:
  friend class OperatorSequence;
  struct KernelArgBinding {
    bool scalar = false;
    std::string name;  // buffer binding (name or slice) or scalar name
    isa::DType dtype = isa::DType::kF32;
    isa::Access access = isa::Access::kIn;
    View view;  // buffers: resolved once at compile(), the arenas never move
    // inout in a fused kernel whose first step using it writes it (an intermediate, or
    // an output read by later steps): launched as LaunchArg::written_first.
    bool written_first = false;
  };
  // A kernel, or a stream command when `command` is set (no image or code then).
  struct CompiledKernel {
    std::optional<isa::Image> image;  // built, until `code` registers it
    uint32_t grid = 1;
    exec::CodeHandle code;
    std::vector<KernelArgBinding> args;
    std::shared_ptr<const StreamCommand> command = nullptr;
  };
  CompiledSequence() = default;
  StatusOr<View> resolve(std::string_view binding) const;
  std::map<std::string, View, std::less<>> shared_;
  std::shared_ptr<Runtime> runtime_;
  std::shared_ptr<exec::StreamPool> streams_;  // call()'s streams
  std::optional<exec::SlotLease> running_;     // between start() and finish()
  std::string name_;
  Dispatch dispatch_ = Dispatch::kFused;
  Buffer arenas_[3];
  std::vector<BufferPlacement> placements_;
  std::vector<CompiledKernel> kernels_;
  std::vector<exec::CodeHandle> code_;
  std::vector<std::string> outputs_;
  std::vector<std::string> scalars_;  // sorted
};

}  // namespace npurt::graph
