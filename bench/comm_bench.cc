// The MPI backend's all_reduce next to its peer measured in the same run: a plain
// MPI_Allreduce of the same bytes on host memory. Run under mpirun (`make
// bench-comm`, 2 ranks). Sizes: 2.5 KiB (640 f32, one hidden vector of a decode
// step: latency) and 4 MiB (bandwidth). Per repetition the ranks meet at a barrier,
// then each times one operation: npurt's is enqueue + stream_synchronize, on both
// paths: device-direct (MPI on the device's bytes, the default here) and staged
// (copies to host memory and back around MPI, the path of devices whose memory the
// host cannot address); the peer's is the blocking call. They alternate repetition by
// repetition so drift affects all alike. Two floors come with them: the nonblocking
// MPI operations npurt runs, polled to completion on host memory ("its MPI": the
// exchange of sends and receives of a small all-reduce, else MPI_Iallreduce), and the
// device round trip of the staging copies without MPI. Figures are medians; each is
// the slowest rank's.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "must.h"
#include "npurt/comm/mpi.h"

namespace {

using namespace npurt;
using bench::must;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double slowest_rank(double mine) {
  double worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

template <typename F>
double time_us(F&& f) {
  const Clock::time_point t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Case {
  const char* name;
  uint64_t elements;
  int reps;
};

struct Result {
  double peer_us = 0;
  double ours_us = 0;         // device-direct
  double staged_us = 0;
  double nonblocking_us = 0;  // MPI_Iallreduce + MPI_Test loop on host memory
  double stream_us = 0;       // the device round trip alone: the staging copies, no MPI
};

Result measure(comm::MpiCommunicator& c, comm::MpiCommunicator& staged, hal::StreamId stream, const Case& k) {
  Runtime& rt = c.runtime();
  const uint64_t bytes = k.elements * sizeof(float);
  // Zeros stay zeros however often they are summed: no overflow, no denormals.
  Buffer buffer = must(rt.memory().create_buffer(bytes));
  {
    WriteGuard g = must(rt.memory().overwrite(buffer.view()));
    std::memset(g.bytes().data(), 0, bytes);
  }
  std::vector<float> host(k.elements, 0.f);
  auto ours = [&] {
    must(c.all_reduce(stream, buffer.view(), isa::DType::kF32));
    must(rt.device().stream_synchronize(stream));
  };
  auto ours_staged = [&] {
    must(staged.all_reduce(stream, buffer.view(), isa::DType::kF32));
    must(rt.device().stream_synchronize(stream));
  };
  auto peer = [&] {
    MPI_Allreduce(MPI_IN_PLACE, host.data(), static_cast<int>(k.elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  // What npurt's all_reduce asks of MPI, on host memory: up to 8 KiB on a power-of-two
  // number of ranks, pairwise exchanges of nonblocking sends and receives (recursive
  // doubling); otherwise MPI_Iallreduce.
  const int size = c.size(), me = c.rank();
  const bool exchange = bytes <= (8 << 10) && size > 1 && (size & (size - 1)) == 0;
  std::vector<float> theirs(k.elements);
  auto nonblocking = [&] {
    const int count = static_cast<int>(k.elements);
    if (!exchange) {
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, host.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      for (int done = 0; done == 0;) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      return;
    }
    for (int step = 1; step < size; step <<= 1) {
      MPI_Request requests[2];
      MPI_Irecv(theirs.data(), count, MPI_FLOAT, me ^ step, 0, MPI_COMM_WORLD, &requests[0]);
      MPI_Isend(host.data(), count, MPI_FLOAT, me ^ step, 0, MPI_COMM_WORLD, &requests[1]);
      for (int done = 0; done == 0;) MPI_Testall(2, requests, &done, MPI_STATUSES_IGNORE);
      for (size_t i = 0; i < k.elements; ++i) host[i] += theirs[i];
    }
  };
  std::vector<float> staging(k.elements);
  const hal::DeviceAddr addr = buffer.device_address();
  auto stream_only = [&] {
    must(rt.device().copy_to_host(stream, staging.data(), addr, bytes));
    must(rt.device().enqueue_host_function(stream, [](const Status&) { return ok_status(); }));
    must(rt.device().copy_to_device(stream, addr, staging.data(), bytes));
    must(rt.device().stream_synchronize(stream));
  };
  for (int i = 0; i < 10; ++i) {
    ours();
    ours_staged();
    peer();
  }
  std::vector<double> ours_us, staged_us, peer_us, nonblocking_us, stream_us;
  for (int i = 0; i < k.reps; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    ours_us.push_back(time_us(ours));
    MPI_Barrier(MPI_COMM_WORLD);
    staged_us.push_back(time_us(ours_staged));
    MPI_Barrier(MPI_COMM_WORLD);
    peer_us.push_back(time_us(peer));
    MPI_Barrier(MPI_COMM_WORLD);
    nonblocking_us.push_back(time_us(nonblocking));
    stream_us.push_back(time_us(stream_only));
  }
  return {slowest_rank(median(peer_us)), slowest_rank(median(ours_us)), slowest_rank(median(staged_us)),
          slowest_rank(median(nonblocking_us)), slowest_rank(median(stream_us))};
}

}  // namespace

int main(int argc, char** argv) {
  auto session = must(comm::mpi_init(argc, argv));
  auto runtime = must(Runtime::create("sim", {.cores = 2, .memory_bytes = 256ull << 20}));
  auto c = must(comm::MpiCommunicator::create(runtime));
  auto staged = must(comm::MpiCommunicator::create(runtime, {.device_direct = false}));
  const hal::StreamId stream = must(runtime->device().create_stream());
  const Case cases[] = {{"2.5 KiB (640 f32)", 640, 2000}, {"4 MiB (1M f32)", 1u << 20, 200}};
  if (c->rank() == 0) {
    std::printf("all_reduce f32 over %d ranks, medians of the slowest rank (MPI_Allreduce on host memory = peer)\n",
                c->size());
    std::printf("%-18s %9s %9s %7s %9s %7s %10s %10s %7s %14s %15s\n", "size", "peer us", "npurt us", "lat x",
                "staged us", "lat x", "peer GB/s", "npurt GB/s", "bw x", "its MPI us", "copies only us");
  }
  for (const Case& k : cases) {
    const Result r = measure(*c, *staged, stream, k);
    const double gb = static_cast<double>(k.elements * sizeof(float)) / 1e9;
    const double peer_bw = gb / (r.peer_us * 1e-6), ours_bw = gb / (r.ours_us * 1e-6);
    if (c->rank() == 0) {
      std::printf("%-18s %9.2f %9.2f %7.2f %9.2f %7.2f %10.2f %10.2f %7.2f %14.2f %15.2f\n", k.name, r.peer_us,
                  r.ours_us, r.ours_us / r.peer_us, r.staged_us, r.staged_us / r.peer_us, peer_bw, ours_bw,
                  ours_bw / peer_bw, r.nonblocking_us, r.stream_us);
    }
  }
  must(runtime->device().destroy_stream(stream));
  c.reset();
  staged.reset();
  runtime.reset();
  return 0;
}
