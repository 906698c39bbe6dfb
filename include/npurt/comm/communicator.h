// Communicator: one rank of a group of devices, with stream-ordered collectives.
//
//   auto group = comm::DeviceGroup::create("sim", 2, spec);          // in one process
//   std::shared_ptr<comm::Communicator> c0 = (*group)->communicator(0);
//   c0->all_reduce(stream0, view0, isa::DType::kF32);             // enqueued, returns
//   c1->all_reduce(stream1, view1, isa::DType::kF32);             // the peers' half
//   // or, one device per MPI rank:
//   auto c = comm::MpiCommunicator::create(runtime);               // comm/mpi.h
//
// A rank drives one device (its Runtime). A collective is enqueued on one of that
// device's streams after the work already there and completes asynchronously: the
// calling thread never waits for peers (the in-process backend meets them, and the
// MPI backend runs MPI, in host functions on the streams: on a stream's thread or on
// a thread blocked in its stream_synchronize). Every rank must issue the same
// collectives in the same order with the same sizes. In-process, a rank's
// collectives must also run in that order on its device: issue them on one stream,
// or order their streams (their exchange rounds share the landing zones); the MPI
// backend starts them in issue order whatever their streams.
//
// Views are of the rank's runtime's memory context, which orders a collective with
// the work around it exactly as it orders a launch (MemoryContext::enqueue_command):
// stale host bytes are uploaded first, the result is device-newer afterwards.
//
// Failures: a collective whose peers do not arrive within the timeout, or whose
// peer's stream failed before it, fails on the stream with an error naming the
// collective, its sequence number and the rank; the device stays usable. Bad input
// (wrong sizes, a dtype that cannot be summed, a root out of range, a closed runtime)
// is returned at once and nothing is enqueued.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "npurt/base/status.h"
#include "npurt/hal/device.h"
#include "npurt/isa/isa.h"
#include "npurt/memory/buffer.h"
#include "npurt/runtime/runtime.h"

namespace npurt::comm {

// Counters of one rank since its creation.
struct CommStats {
  uint64_t collectives = 0;  // enqueued
  uint64_t bytes = 0;        // of the views given to them
  // Host memory kept until exit because MPI may still write it: the receive buffers
  // of collectives that timed out or were abandoned (MPI backend).
  uint64_t kept_bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "in-process" or "mpi".
  virtual const char* backend() const = 0;
  // The rank's device and everything on it.
  virtual Runtime& runtime() const = 0;

  // Sums `data` over the ranks, in place; `dtype` is kF32 or kBF16 (bf16 sums are
  // formed in f32 and rounded once per addition). Every rank ends with the same bytes.
  virtual Status all_reduce(hal::StreamId stream, const View& data, isa::DType dtype) = 0;
  // `gathered` (size() x local's bytes) receives every rank's `local`, in rank order.
  virtual Status all_gather(hal::StreamId stream, const View& local, const View& gathered) = 0;
  // Every rank's `data` receives the bytes of `root`'s.
  virtual Status broadcast(hal::StreamId stream, const View& data, int root) = 0;
  // Completes on every rank's stream once every rank's stream reached it.
  virtual Status barrier(hal::StreamId stream) = 0;

  // Host-side and blocking: every rank of the group passes its own status (say, of
  // loading its shard of a model) and gets the first failure among all ranks, naming
  // the rank, or OK when all succeeded; within the timeout. In-process ranks are
  // driven by one host thread that sees every status itself, so their agree() returns
  // `mine`.
  virtual Status agree(const Status& mine) = 0;

  // Gives up on the collectives in flight and to come, because this rank cannot take
  // its part (say, its half of a step failed to enqueue): the peers' and this rank's
  // pending collectives fail with `why` instead of waiting out the timeout.
  virtual void abort(const Status& why) = 0;

  virtual CommStats stats() const = 0;
};

// The largest sizes and the patience of a group's collectives.
struct CommOptions {
  // In-process backend: bytes each rank sends per exchange round; larger collectives
  // run in several rounds. Each device keeps 2 x size x chunk_bytes of landing space.
  uint64_t chunk_bytes = 1ull << 20;
  // How long a collective waits for its peers before failing.
  std::chrono::milliseconds timeout{60'000};
  // In-process backend: where every device's memory is host-addressable
  // (DeviceInfo::host_addressable_memory), all_reduce adds the ranks' pieces in
  // the stream's host function as it meets its peers, in rank order with the kernels'
  // roundings (the same bytes); false (or on other devices): a sum kernel per peer.
  bool host_sums = true;
  // MPI backend: where the device's memory is host-addressable
  // (DeviceInfo::host_addressable_memory), MPI reads and writes the views' device bytes
  // themselves; false (or on other devices): through host staging copies.
  bool device_direct = true;
  // Device memory that MPI may still write after a timeout (device-direct) is kept
  // until the process exits; Hazard::kReusesAbandonedMpiMemory (base/hazards.h) is the
  // wrong policy tests use, freeing and reusing it like any other.
};

// The element size of a summable dtype, or 0.
uint64_t reduce_element_bytes(isa::DType dtype);

}  // namespace npurt::comm
