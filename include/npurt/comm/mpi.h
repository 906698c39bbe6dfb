// The MPI backend: one device per MPI rank, collectives run by MPI in stream order.
//
//   int main(int argc, char** argv) {
//     auto mpi = comm::mpi_init(argc, argv);                  // MPI_Finalize at scope exit
//     auto runtime = Runtime::create("sim");
//     auto c = comm::MpiCommunicator::create(*runtime);        // rank = MPI rank
//     c->all_reduce(stream, view, isa::DType::kF32);           // enqueued, returns
//   }
//
// A collective is a host function on the stream (Device::enqueue_host_function)
// that runs the nonblocking MPI collective and polls it until it completes or the
// timeout passes, so the calling thread never waits for MPI and the collective is
// ordered with the stream's other work like a launch. Where the device's memory is
// host-addressable (DeviceInfo::host_addressable_memory, as the simulated NPU's is)
// MPI reads and writes the views' device bytes themselves (device-direct, like
// CUDA-aware MPI on device pointers); elsewhere, or with CommOptions::device_direct
// off, the bytes are copied into host staging memory first and the result back. An
// all-reduce of at most 8 KiB on a power-of-two number of ranks runs as pairwise
// exchanges of nonblocking sends and receives (recursive doubling, each pair adding
// in one order: the same bytes on every rank), which on shared memory cost what the
// blocking MPI_Allreduce does where MPI_Iallreduce costs twice that; its messages are
// tagged with the collective's number.
//
// Ordering across streams: MPI matches collectives by the order in which each rank
// starts them. A rank starts its collectives in the order it issued them (their
// sequence numbers), whichever streams they are on, so ranks that issue the same
// collectives in the same order match even when their streams run at different
// speeds.
//
// Failures. A collective whose peers do not arrive within CommOptions::timeout fails
// its stream with "all_reduce #7 on rank 1 of 2: peers did not arrive within 60000
// ms"; MPI's own errors (MPI_ERRORS_RETURN) fail it with MPI's error string. MPI
// cannot cancel a collective, so the memory it was given may still be written after
// the collective failed: staging memory and an exchange's receive memory are kept
// until exit (CommStats::kept_bytes counts the latter), and device memory
// (device-direct) too (MemoryContext::retain_until_exit): the buffer may be freed,
// its block is never reused. A collective reached by a stream that failed earlier
// cannot take part (its input bytes never arrived), so it is skipped and its peers
// time out. After any of these
// the ranks' sequences no longer match, so the communicator's later collectives fail
// at once, naming the first failure; agree() runs on a communicator of its own and
// still works, which is how ranks learn of each other's failures and exit together.
//
// Cost: on top of MPI's own collective, the enqueue (the memory context's ordering)
// and, unless a thread waiting in stream_synchronize runs the host function itself
// (the simulator's does when the stream is idle), two hand-offs between the calling
// thread and the stream's; on the staged path a device-to-host and a host-to-device
// copy (bench/comm_bench.cc measures both paths). mpi_init() makes Open MPI's
// MPI_Iallreduce use its ring algorithm unless told otherwise
// (OMPI_MCA_coll_libnbc_iallreduce_algorithm): its default moved megabytes at half the
// speed of the blocking MPI_Allreduce on 2 ranks.
//
// Threading: MPI calls of the backend are serialized by one process-wide mutex, so
// MPI_THREAD_SERIALIZED suffices. A program's own MPI calls may overlap the
// backend's only when MpiSession::thread_level() is MPI_THREAD_MULTIPLE.
#pragma once

#include <memory>

#include "npurt/base/status.h"
#include "npurt/comm/communicator.h"
#include "npurt/runtime/runtime.h"

namespace npurt::comm {

// MPI for the process: initialized by init(), finalized by the destructor.
class MpiSession {
 public:
  // MPI_Init_thread asking for MPI_THREAD_MULTIPLE. kFailedPrecondition when MPI
  // was initialized already or provides less than MPI_THREAD_SERIALIZED.
  static StatusOr<std::unique_ptr<MpiSession>> init(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // The thread level MPI provides (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }

 private:
  MpiSession(int world_rank, int world_size, int thread_level)
      : world_rank_(world_rank), world_size_(world_size), thread_level_(thread_level) {}

  int world_rank_;
  int world_size_;
  int thread_level_;
};

inline StatusOr<std::unique_ptr<MpiSession>> mpi_init(int& argc, char**& argv) {
  return MpiSession::init(&argc, &argv);
}

class MpiCommunicator final : public Communicator {
 public:
  // A rank per MPI process, on `runtime`'s device, over a duplicate of
  // MPI_COMM_WORLD (and a second one for agree()). Collective: every rank calls it.
  // kFailedPrecondition when MPI is not initialized.
  static StatusOr<std::shared_ptr<MpiCommunicator>> create(std::shared_ptr<Runtime> runtime,
                                                           CommOptions options = {});
  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  const char* backend() const override { return "mpi"; }
  Runtime& runtime() const override { return *runtime_; }

  Status all_reduce(hal::StreamId stream, const View& data, isa::DType dtype) override;
  Status all_gather(hal::StreamId stream, const View& local, const View& gathered) override;
  Status broadcast(hal::StreamId stream, const View& data, int root) override;
  Status barrier(hal::StreamId stream) override;
  Status agree(const Status& mine) override;
  void abort(const Status& why) override;
  CommStats stats() const override;

  // What MPI's handles and the collectives in flight share (mpi_communicator.cc).
  struct Group;

 private:
  MpiCommunicator(std::shared_ptr<Runtime> runtime, std::shared_ptr<Group> group)
      : runtime_(std::move(runtime)), group_(std::move(group)) {}

  const std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<Group> group_;
};

}  // namespace npurt::comm
