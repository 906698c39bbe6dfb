// The MPI backend under mpirun, each rank on a simulated NPU of its own: collectives
// against host references on fresh random data, every rank's result byte for byte
// the same, the host thread free while peers are late, bad input refused with
// nothing enqueued, agree() spreading one rank's failure, and (MpiDeadRank, run
// alone) a rank that dies before a collective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "npurt/comm/mpi.h"
#include "comm/mpi_gtest.h"
#include "npurt/isa/numeric.h"
#include "value_or_die.h"

namespace npurt::comm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kSizes[] = {1, 3, 640, 4099, 65536, 1u << 20};

using npurt::testing::value_or_die;

bool contains(const Status& s, const std::string& text) { return s.message().find(text) != std::string::npos; }

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// The path under test: MPI on the device's own bytes (the simulated NPU's memory is
// host-addressable), or with NPURT_MPI_STAGED set, through host staging copies (the
// path of devices whose memory is not). CTest runs the suite both ways.
CommOptions options(std::chrono::milliseconds timeout) {
  return {.timeout = timeout, .device_direct = std::getenv("NPURT_MPI_STAGED") == nullptr};
}

// One rank's device, communicator and stream, shared by the tests of the process.
struct Rank {
  std::shared_ptr<Runtime> runtime;
  std::shared_ptr<MpiCommunicator> comm;
  hal::StreamId stream{};
};

Rank& rank() {
  static Rank r;
  return r;
}

void open_rank() {
  Rank& r = rank();
  r.runtime = value_or_die(Runtime::create("sim", {.cores = 2, .memory_bytes = 256ull << 20}));
  // Shorter than the CTest timeout, so a rank that goes astray fails the others by name.
  r.comm = value_or_die(MpiCommunicator::create(r.runtime, options(std::chrono::milliseconds(20'000))));
  r.stream = value_or_die(r.runtime->device().create_stream());
}

void close_rank() {
  Rank& r = rank();
  if (r.runtime) r.runtime->device().destroy_stream(r.stream).ignore();
  r.comm.reset();
  r.runtime.reset();
}

// The inputs of `rank` for one case: any rank can form every rank's inputs itself.
std::vector<float> random_floats(int rank, uint64_t n, uint32_t salt) {
  std::mt19937 rng(static_cast<uint32_t>(rank) * 7919u + salt * 104729u + static_cast<uint32_t>(n));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Buffer make_buffer(uint64_t bytes) { return value_or_die(rank().runtime->memory().create_buffer(bytes)); }

void write_bytes(const View& view, const void* src) {
  WriteGuard g = value_or_die(rank().runtime->memory().overwrite(view));
  std::memcpy(g.bytes().data(), src, g.bytes().size());
}

// NaN bytes on the device (and the host), so a collective that skips part of its
// output shows.
void poison(const View& view) {
  std::vector<uint8_t> nan(view.size(), 0xFF);
  write_bytes(view, nan.data());
  ASSERT_TRUE(rank().runtime->memory().to_device(view).ok());
}

std::vector<uint8_t> read_bytes(const View& view) {
  ReadGuard g = value_or_die(rank().runtime->memory().read(view));
  return {g.bytes().begin(), g.bytes().end()};
}

std::vector<float> read_floats(const View& view) {
  const std::vector<uint8_t> bytes = read_bytes(view);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

Status sync() { return rank().runtime->device().stream_synchronize(rank().stream); }

uint64_t fnv1a(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

// True when every rank holds these very bytes.
bool same_on_every_rank(const std::vector<uint8_t>& bytes) {
  const uint64_t h = fnv1a(bytes);
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

double rel_l2(const std::vector<double>& got, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0 ? std::sqrt(err) : std::sqrt(err / norm);
}

TEST(MpiCollectives, AllReduceF32) {
  MpiCommunicator& c = *rank().comm;
  for (uint64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Buffer b = make_buffer(n * 4);
    write_bytes(b.view(), random_floats(c.rank(), n, 1).data());
    ASSERT_TRUE(c.all_reduce(rank().stream, b.view(), isa::DType::kF32).ok());
    ASSERT_TRUE(sync().ok());
    std::vector<double> ref(n, 0.0);
    for (int r = 0; r < c.size(); ++r) {
      const std::vector<float> in = random_floats(r, n, 1);
      for (uint64_t i = 0; i < n; ++i) ref[i] += in[i];
    }
    const std::vector<uint8_t> out = read_bytes(b.view());
    std::vector<double> got(n);
    for (uint64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, out.data() + 4 * i, 4);
      got[i] = f;
    }
    EXPECT_LE(rel_l2(got, ref), 1e-6);
    EXPECT_TRUE(same_on_every_rank(out));
  }
}

TEST(MpiCollectives, AllReduceBF16) {
  MpiCommunicator& c = *rank().comm;
  auto bf16_inputs = [](int r, uint64_t n) {
    const std::vector<float> f = random_floats(r, n, 2);
    std::vector<uint16_t> h(n);
    for (uint64_t i = 0; i < n; ++i) h[i] = isa::f32_to_bf16(f[i]);
    return h;
  };
  for (uint64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Buffer b = make_buffer(n * 2);
    write_bytes(b.view(), bf16_inputs(c.rank(), n).data());
    ASSERT_TRUE(c.all_reduce(rank().stream, b.view(), isa::DType::kBF16).ok());
    ASSERT_TRUE(sync().ok());
    std::vector<double> ref(n, 0.0);
    for (int r = 0; r < c.size(); ++r) {
      const std::vector<uint16_t> in = bf16_inputs(r, n);
      for (uint64_t i = 0; i < n; ++i) ref[i] += isa::bf16_to_f32(in[i]);
    }
    const std::vector<uint8_t> out = read_bytes(b.view());
    std::vector<double> got(n);
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, out.data() + 2 * i, 2);
      got[i] = isa::bf16_to_f32(h);
    }
    EXPECT_LE(rel_l2(got, ref), 1e-2);
    EXPECT_TRUE(same_on_every_rank(out));
  }
}

TEST(MpiCollectives, AllGather) {
  MpiCommunicator& c = *rank().comm;
  for (uint64_t n : kSizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    Buffer local = make_buffer(n * 4), gathered = make_buffer(n * 4 * static_cast<uint64_t>(c.size()));
    write_bytes(local.view(), random_floats(c.rank(), n, 3).data());
    poison(gathered.view());
    ASSERT_TRUE(c.all_gather(rank().stream, local.view(), gathered.view()).ok());
    ASSERT_TRUE(sync().ok());
    std::vector<uint8_t> expected;
    for (int r = 0; r < c.size(); ++r) {
      const std::vector<uint8_t> part = as_bytes(random_floats(r, n, 3));
      expected.insert(expected.end(), part.begin(), part.end());
    }
    const std::vector<uint8_t> out = read_bytes(gathered.view());
    EXPECT_TRUE(out == expected);
    EXPECT_TRUE(same_on_every_rank(out));
  }
}

TEST(MpiCollectives, BroadcastFromEachRoot) {
  MpiCommunicator& c = *rank().comm;
  for (uint64_t n : kSizes) {
    for (int root = 0; root < c.size(); ++root) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", root " + std::to_string(root));
      Buffer b = make_buffer(n * 4);
      const std::vector<uint8_t> expected = as_bytes(random_floats(root, n, 4));
      if (c.rank() == root) {
        write_bytes(b.view(), expected.data());
      } else {
        poison(b.view());
      }
      ASSERT_TRUE(c.broadcast(rank().stream, b.view(), root).ok());
      ASSERT_TRUE(sync().ok());
      const std::vector<uint8_t> out = read_bytes(b.view());
      EXPECT_TRUE(out == expected);
      EXPECT_TRUE(same_on_every_rank(out));
    }
  }
}

TEST(MpiCollectives, Barrier) {
  MpiCommunicator& c = *rank().comm;
  const CommStats before = c.stats();
  // Ranks arrive at different times; the barrier completes on all.
  std::this_thread::sleep_for(std::chrono::milliseconds(30 * c.rank()));
  ASSERT_TRUE(c.barrier(rank().stream).ok());
  EXPECT_TRUE(sync().ok());
  EXPECT_EQ(c.stats().collectives, before.collectives + 1);
}

// Rank 0 enqueues while its peers are 300 ms late: the call returns with the
// collective still pending and without waiting on the host.
TEST(MpiCollectives, HostThreadNotBlockedByLatePeers) {
  MpiCommunicator& c = *rank().comm;
  const uint64_t n = 640;
  Buffer b = make_buffer(n * 4);
  write_bytes(b.view(), random_floats(c.rank(), n, 5).data());
  MPI_Barrier(MPI_COMM_WORLD);
  if (c.rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t host_waits = rank().runtime->memory().stats().host_waits;
  ASSERT_TRUE(c.all_reduce(rank().stream, b.view(), isa::DType::kF32).ok());
  if (c.rank() == 0) {
    const StatusOr<bool> done = rank().runtime->device().stream_query(rank().stream);
    ASSERT_TRUE(done.ok());
    EXPECT_FALSE(*done) << "the collective completed before its peers arrived";
    EXPECT_EQ(rank().runtime->memory().stats().host_waits, host_waits);
  }
  ASSERT_TRUE(sync().ok());
  const std::vector<uint8_t> out = read_bytes(b.view());
  EXPECT_TRUE(same_on_every_rank(out));
}

// Collectives on two streams, each delayed on a different rank: they still match in
// the order they were issued (sizes differ, so a mismatch would show). Small ones
// (exchanges of messages, tagged by collective) and ones over 8 KiB (MPI_Iallreduce,
// which MPI matches by the order each rank starts them).
TEST(MpiCollectives, TwoStreamsMatchInIssueOrder) {
  MpiCommunicator& c = *rank().comm;
  hal::Device& device = rank().runtime->device();
  const hal::StreamId other = value_or_die(device.create_stream());
  const hal::StreamId first = c.rank() == 0 ? rank().stream : other;
  const hal::StreamId second = c.rank() == 0 ? other : rank().stream;
  auto nap = [](const Status&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return ok_status();
  };
  for (auto [n1, n2] : {std::pair<uint64_t, uint64_t>{640, 3}, {4096, 2051}}) {
    SCOPED_TRACE("n = " + std::to_string(n1) + ", " + std::to_string(n2));
    ASSERT_TRUE(device.enqueue_host_function(c.rank() == 0 ? first : second, nap).ok());
    Buffer a = make_buffer(n1 * 4), b = make_buffer(n2 * 4);
    write_bytes(a.view(), random_floats(c.rank(), n1, 6).data());
    write_bytes(b.view(), random_floats(c.rank(), n2, 6).data());
    ASSERT_TRUE(c.all_reduce(first, a.view(), isa::DType::kF32).ok());
    ASSERT_TRUE(c.all_reduce(second, b.view(), isa::DType::kF32).ok());
    EXPECT_TRUE(device.stream_synchronize(first).ok());
    EXPECT_TRUE(device.stream_synchronize(second).ok());
    for (auto [view, n] : {std::pair{a.view(), n1}, {b.view(), n2}}) {
      std::vector<double> ref(n, 0.0);
      for (int r = 0; r < c.size(); ++r) {
        const std::vector<float> in = random_floats(r, n, 6);
        for (uint64_t i = 0; i < n; ++i) ref[i] += in[i];
      }
      const std::vector<float> out = read_floats(view);
      EXPECT_LE(rel_l2(std::vector<double>(out.begin(), out.end()), ref), 1e-6);
    }
  }
  EXPECT_TRUE(device.destroy_stream(other).ok());
}

TEST(MpiCollectives, BadInputIsRefusedAndNothingEnqueued) {
  MpiCommunicator& c = *rank().comm;
  Buffer local = make_buffer(64), wrong = make_buffer(64 * static_cast<uint64_t>(c.size()) + 4);
  const CommStats before = c.stats();
  const uint64_t commands = rank().runtime->memory().stats().launches;
  const std::string where = "#" + std::to_string(before.collectives + 1) + " on rank " + std::to_string(c.rank()) +
                            " of " + std::to_string(c.size());

  Status s = c.all_gather(rank().stream, local.view(), wrong.view());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s, "all_gather " + where)) << s.to_string();
  EXPECT_TRUE(contains(s, "gathered holds")) << s.to_string();
  for (int root : {-1, c.size()}) {
    s = c.broadcast(rank().stream, local.view(), root);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(s, "broadcast " + where + ": root " + std::to_string(root))) << s.to_string();
  }
  s = c.all_reduce(rank().stream, local.view(), isa::DType::kI32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s, "all_reduce " + where + ": dtype")) << s.to_string();

  EXPECT_EQ(c.stats().collectives, before.collectives);
  EXPECT_EQ(rank().runtime->memory().stats().launches, commands);
  EXPECT_TRUE(*rank().runtime->device().stream_query(rank().stream));
  // The numbering did not move: the next collective still matches its peers'.
  ASSERT_TRUE(c.barrier(rank().stream).ok());
  EXPECT_TRUE(sync().ok());
}

TEST(MpiCollectives, AgreeSpreadsTheFirstFailure) {
  MpiCommunicator& c = *rank().comm;
  EXPECT_TRUE(c.agree(ok_status()).ok());
  const Status mine = c.rank() == 1 ? not_found("model file shard-1.gguf is missing") : ok_status();
  Status s = c.agree(mine);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "rank 1: model file shard-1.gguf is missing");
  // Several failures: the lowest rank's.
  const Status odd = c.rank() % 2 == 1 ? invalid_argument("rank parity " + std::to_string(c.rank())) : ok_status();
  s = c.agree(odd);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "rank 1: rank parity 1");
  // A long message is cut, not lost.
  s = c.agree(c.rank() == 0 ? internal_error(std::string(2000, 'x')) : ok_status());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "rank 0: " + std::string(512, 'x'));
}

// Rank 1's stream fails after it enqueued an all_reduce: its collective is skipped
// (it has no input), its peers time out, and agree() tells every rank what happened.
// On a communicator and stream of its own: both are unusable afterwards.
TEST(MpiCollectives, AFailedStreamSkipsItsCollectiveAndPeersTimeOut) {
  auto c = value_or_die(MpiCommunicator::create(rank().runtime, options(std::chrono::milliseconds(1'000))));
  hal::Device& device = rank().runtime->device();
  const hal::StreamId stream = value_or_die(device.create_stream());
  Buffer b = make_buffer(640 * 4);
  write_bytes(b.view(), random_floats(c->rank(), 640, 8).data());
  if (c->rank() == 1) {
    ASSERT_TRUE(device
                    .enqueue_host_function(stream,
                                           [](const Status&) {
                                             std::this_thread::sleep_for(std::chrono::milliseconds(100));
                                             return device_fault("injected fault");
                                           })
                    .ok());
  }
  ASSERT_TRUE(c->all_reduce(stream, b.view(), isa::DType::kF32).ok());
  const Status mine = device.stream_synchronize(stream);
  const std::string me = "all_reduce #1 on rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size());
  if (c->rank() == 1) {
    EXPECT_TRUE(contains(mine, "injected fault")) << mine.to_string();
  } else {
    EXPECT_TRUE(contains(mine, me + ": peers did not arrive within 1000 ms")) << mine.to_string();
  }
  const Status later = c->all_reduce(rank().stream, b.view(), isa::DType::kF32);
  EXPECT_TRUE(contains(later, "all_reduce #2") && contains(later, "unusable since")) << later.to_string();
  const Status all = c->agree(mine);
  EXPECT_EQ(all.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(contains(all, "rank 0: ") && contains(all, "peers did not arrive")) << all.to_string();
  EXPECT_TRUE(device.destroy_stream(stream).ok());
}

// For the timeout tests: a communicator of its own with options `o`, a stream of its
// own (destroyed at the end) and a buffer of n ones.
struct LateCase {
  LateCase(const CommOptions& o, uint64_t n)
      : comm(value_or_die(MpiCommunicator::create(rank().runtime, o))),
        stream(value_or_die(rank().runtime->device().create_stream())),
        buffer(make_buffer(n * 4)) {
    const std::vector<float> ones(n, 1.f);
    write_bytes(buffer.view(), ones.data());
  }
  ~LateCase() { EXPECT_TRUE(rank().runtime->device().destroy_stream(stream).ok()); }
  // All-reduces the buffer in f32; the stream's status once it ran.
  Status reduce() {
    NPURT_RETURN_IF_ERROR(comm->all_reduce(stream, buffer.view(), isa::DType::kF32));
    return rank().runtime->device().stream_synchronize(stream);
  }
  std::shared_ptr<MpiCommunicator> comm;
  hal::StreamId stream;
  Buffer buffer;
};

// Rank 0's all_reduce times out before the others issue theirs; MPI cannot cancel it,
// so when they do, MPI completes it into rank 0's device bytes, long after the
// collective failed and its buffer was freed. Device-direct, those bytes are kept
// until exit: a buffer made after the timeout gets other memory and keeps its bytes,
// and the late sum lands in the kept block. (With Hazard::kReusesAbandonedMpiMemory on,
// the new buffer takes the freed block and the late sum overwrites it.) 16 KiB: an
// all-reduce MPI_Iallreduce runs (smaller ones exchange messages; the next test).
TEST(MpiCollectives, MemoryMpiMayStillWriteAfterATimeoutIsNotReused) {
  const CommOptions o = options(std::chrono::milliseconds(300));
  if (!o.device_direct) GTEST_SKIP() << "staged: MPI writes host staging memory, kept until exit since ever";
  constexpr uint64_t n = 4096;
  LateCase late(o, n);
  const std::vector<float> sum(n, static_cast<float>(late.comm->size()));
  auto device_floats = [&](hal::DeviceAddr addr) {
    const uint8_t* p = value_or_die(rank().runtime->device().host_address(addr, n * 4, /*writes=*/false));
    std::vector<float> v(n);
    std::memcpy(v.data(), p, n * 4);
    return v;
  };
  const uint64_t retained_before = rank().runtime->memory().stats().retained_bytes;
  if (late.comm->rank() == 0) {
    const Status s = late.reduce();
    EXPECT_TRUE(contains(s, "peers did not arrive within 300 ms")) << s.to_string();
    const hal::DeviceAddr abandoned = late.buffer.device_address();
    ASSERT_TRUE(late.buffer.free().ok());
    Buffer b = make_buffer(n * 4);
    const std::vector<float> sevens(n, 7.f);
    write_bytes(b.view(), sevens.data());
    ASSERT_TRUE(rank().runtime->memory().to_device(b.view()).ok());
    EXPECT_NE(b.device_address(), abandoned);
    EXPECT_EQ(rank().runtime->memory().stats().retained_bytes, retained_before + n * 4);
    MPI_Barrier(MPI_COMM_WORLD);  // the others join the abandoned all_reduce now
    MPI_Barrier(MPI_COMM_WORLD);  // and this one's MPI progress completes it
    EXPECT_EQ(device_floats(b.device_address()), sevens) << "a late MPI write reached a new buffer";
    EXPECT_EQ(device_floats(abandoned), sum);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_TRUE(late.reduce().ok());
    EXPECT_EQ(device_floats(late.buffer.device_address()), sum);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// A small all-reduce (an exchange of messages between pairs of ranks) that times out
// on rank 0 before the others issue theirs: rank 0's receive stays posted, so MPI
// writes the late message into its receive memory after the collective failed, and
// its send may still read the device bytes. Both must be kept until exit: checked by
// what the communicator and the memory context count as kept (with
// Hazard::kReusesAbandonedMpiMemory on, the receive memory is freed when the collective
// fails and the device bytes are not retained, and the counts say so). A late rank whose
// exchange partners all stay gets the full sum (on 2 ranks, rank 1); one that needs
// rank 0's later steps times out itself.
TEST(MpiCollectives, ExchangeMemoryMpiMayStillWriteAfterATimeoutIsKept) {
  const CommOptions o = options(std::chrono::milliseconds(300));
  constexpr uint64_t n = 640;
  LateCase late(o, n);
  MpiCommunicator& c = *late.comm;
  const uint64_t retained_before = rank().runtime->memory().stats().retained_bytes;
  if (c.rank() == 0) {
    const Status s = late.reduce();
    EXPECT_TRUE(contains(s, "all_reduce #1 on rank 0") && contains(s, "peers did not arrive within 300 ms"))
        << s.to_string();
    EXPECT_EQ(c.stats().kept_bytes, n * 4);
    if (o.device_direct) {
      EXPECT_EQ(rank().runtime->memory().stats().retained_bytes, retained_before + n * 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // the others join the abandoned all_reduce now
    MPI_Barrier(MPI_COMM_WORLD);  // and this one's MPI progress delivers into the kept memory
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    const Status s = late.reduce();
    if (c.size() == 2) {
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    if (s.ok()) {
      EXPECT_EQ(read_floats(late.buffer.view()), std::vector<float>(n, static_cast<float>(c.size())));
      EXPECT_EQ(c.stats().kept_bytes, 0u);
    } else {
      EXPECT_TRUE(contains(s, "peers did not arrive within 300 ms")) << s.to_string();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Run alone (the comm.mpi_dead_rank test): the last rank exits just before a
// collective; every other rank's collective fails with the timeout error, in bounded
// time. Survivors print a verdict line for CTest and exit at once: MPI_Finalize would
// wait for the dead rank.
TEST(MpiDeadRank, PeersTimeOutWithAClearError) {
  const int me = world_rank();
  auto c = value_or_die(MpiCommunicator::create(rank().runtime, options(std::chrono::milliseconds(2'000))));
  Buffer b = make_buffer(640 * 4);
  write_bytes(b.view(), random_floats(me, 640, 7).data());
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == c->size() - 1) std::_Exit(3);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(c->all_reduce(rank().stream, b.view(), isa::DType::kF32).ok());
  const Status s = sync();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string expected = "all_reduce #1 on rank " + std::to_string(me) + " of " + std::to_string(c->size()) +
                               ": peers did not arrive within 2000 ms";
  EXPECT_TRUE(contains(s, expected)) << s.to_string();
  EXPECT_LT(seconds, 10.0);
  // The sequences no longer match: later collectives fail at once.
  const Status later = c->barrier(rank().stream);
  EXPECT_TRUE(contains(later, "barrier #2 on rank " + std::to_string(me)) && contains(later, "unusable since"))
      << later.to_string();
  const bool passed = !::testing::Test::HasFailure();
  std::printf("rank %d: %s (after %.1f s)\nDEAD-RANK TEST %s on rank %d\n", me, s.to_string().c_str(), seconds,
              passed ? "PASSED" : "FAILED", me);
  std::fflush(stdout);
  std::_Exit(passed ? 0 : 1);
}

}  // namespace
}  // namespace npurt::comm

int main(int argc, char** argv) {
  return npurt::testing::run_tests_on_every_rank(
      argc, argv,
      [] {
        // MpiDeadRank kills a rank: only when asked for.
        if (::testing::GTEST_FLAG(filter) == "*") ::testing::GTEST_FLAG(filter) = "MpiCollectives.*";
        npurt::comm::open_rank();
      },
      [] { npurt::comm::close_rank(); });
}
