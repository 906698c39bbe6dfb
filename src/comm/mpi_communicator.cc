#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "npurt/base/hazards.h"
#include "npurt/comm/mpi.h"
#include "npurt/isa/numeric.h"

namespace npurt::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Every MPI call of the backend holds it, so MPI_THREAD_SERIALIZED is enough and all
// communicators of the process share one MPI.
std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}

// Call with mpi_mutex() held.
std::string mpi_error_string(int err) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(err, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(err);
  return std::string(text, static_cast<size_t>(length));
}

Status mpi_error(int err, const std::string& what) {
  return failed_precondition(what + ": " + mpi_error_string(err));
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

// The memory of a collective that timed out: its request is never completed, so MPI
// may write into the memory any time until MPI_Finalize. It stays allocated (and
// reachable) until the process exits.
void keep_until_exit(std::shared_ptr<void> memory) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(memory));
}

// One bf16 addition: in f32, `first` + `second`, rounded to bf16 once (nearest even).
uint16_t add_bf16(uint16_t first, uint16_t second) {
  return isa::f32_to_bf16(isa::bf16_to_f32(first) + isa::bf16_to_f32(second));
}

// bf16 sums for MPI.
void sum_bf16(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = add_bf16(a[i], b[i]);
}

// Host memory for the bytes of collectives in flight, kept for reuse: a fresh block
// of megabytes costs its page faults again on every collective.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // A block of at least `bytes` bytes; it returns to the pool when its last owner
  // lets go.
  std::shared_ptr<uint8_t> take(uint64_t bytes) {
    std::unique_ptr<uint8_t[]> block;
    uint64_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto fit = std::find_if(free_.begin(), free_.end(), [&](const Free& f) { return f.bytes >= bytes; });
      if (fit != free_.end()) {
        block = std::move(fit->data);
        size = fit->bytes;
        pooled_bytes_ -= size;
        free_.erase(fit);
      }
    }
    if (!block) {
      size = std::max<uint64_t>(bytes, 1);
      block = std::make_unique_for_overwrite<uint8_t[]>(size);
    }
    std::weak_ptr<StagingPool> pool = weak_from_this();
    return std::shared_ptr<uint8_t>(block.release(), [pool, size](uint8_t* p) {
      std::unique_ptr<uint8_t[]> owned(p);
      if (auto alive = pool.lock()) alive->give_back(std::move(owned), size);
    });
  }

 private:
  static constexpr uint64_t kMaxPooledBytes = 64ull << 20;
  struct Free {
    std::unique_ptr<uint8_t[]> data;
    uint64_t bytes = 0;
  };

  void give_back(std::unique_ptr<uint8_t[]> data, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pooled_bytes_ + bytes > kMaxPooledBytes) return;
    pooled_bytes_ += bytes;
    free_.push_back({std::move(data), bytes});
  }

  std::mutex mu_;
  std::vector<Free> free_;     // guarded by mu_
  uint64_t pooled_bytes_ = 0;  // guarded by mu_
};

// The bytes MPI works on: the device's own (device-direct) or host staging memory.
// `send == recv` means in place.
struct MpiBuffers {
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
};

// The sum of a small all-reduce by recursive doubling: at step j each rank swaps its
// partial sums with rank ^ 2^j and adds the partner's to its own, both partners in the
// same order (the lower rank's first), so both, and in the end every rank, hold the
// same bytes.
struct ExchangeSum {
  MPI_Comm comm = MPI_COMM_NULL;
  uint8_t* data = nullptr;  // in place
  int count = 0;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  bool bf16 = false;
  int rank = 0;
  int size = 0;
  int step = 1;  // 2^j
};

// An MPI operation in flight: the requests of its current step (a nonblocking
// collective in requests[0], or an exchange's receive and send), and host memory MPI
// writes until the last step completed.
struct InFlight {
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::optional<ExchangeSum> exchange;  // steps left to run
  std::shared_ptr<uint8_t[]> scratch;
  uint64_t scratch_bytes = 0;
  // For point-to-point steps: the collective's number (modulo MPI_TAG_UB + 1), so
  // that the messages of collectives in flight on several streams at once cannot
  // match each other's.
  int tag = 0;
};

// Starts one MPI operation on `comm` over `b`.
using StartCollective = std::function<int(MPI_Comm comm, const MpiBuffers& b, InFlight* op)>;

// All-reduces of at most this many bytes on a power-of-two number of ranks run as
// exchanges of nonblocking sends and receives (ExchangeSum): on Open MPI's shared
// memory transport, 2.5 KiB over 2 ranks take 1.1 us that way, as long as its blocking
// MPI_Allreduce, where MPI_Iallreduce takes 2.2 us. Beyond the transport's eager size
// (4 KiB) the exchange loses its edge and from 16 KiB on MPI_Iallreduce's ring is faster
// (docs/parallel.md).
constexpr uint64_t kExchangeMaxBytes = 8 << 10;

// Posts step `x.step` of an exchange: receive the partner's partial sums into the
// scratch memory, send ours. Call with mpi_mutex() held.
int post_exchange(const ExchangeSum& x, InFlight& op) {
  const int partner = x.rank ^ x.step;
  int err = MPI_Irecv(op.scratch.get(), x.count, x.type, partner, op.tag, x.comm, &op.requests[0]);
  if (err == MPI_SUCCESS) err = MPI_Isend(x.data, x.count, x.type, partner, op.tag, x.comm, &op.requests[1]);
  return err;
}

// The receive memory of an exchange: the one this thread used last when no one else
// holds it any more (a collective that timed out keeps its own until exit) and it has
// the size (so kept_bytes stays exact), else a new one.
std::shared_ptr<uint8_t[]> exchange_scratch(uint64_t bytes) {
  thread_local std::shared_ptr<uint8_t[]> spare;
  thread_local uint64_t spare_bytes = 0;
  if (!spare || spare.use_count() != 1 || spare_bytes != bytes) {
    spare = std::make_shared_for_overwrite<uint8_t[]>(bytes);
    spare_bytes = bytes;
  }
  return spare;
}

int start_exchange(const ExchangeSum& x, uint64_t bytes, InFlight& op) {
  op.scratch = exchange_scratch(bytes);
  op.scratch_bytes = bytes;
  op.exchange = x;
  return post_exchange(x, op);
}

// After a step's receive and send completed: adds the partner's sums to ours, the
// lower rank's first on both sides (so that even NaN payloads agree), and posts the
// next step, or sets *finished. Call with mpi_mutex() held.
int next_exchange_step(InFlight& op, bool* finished) {
  ExchangeSum& x = *op.exchange;
  const bool mine_first = x.rank < (x.rank ^ x.step);
  if (x.bf16) {
    auto* mine = reinterpret_cast<uint16_t*>(x.data);
    const auto* theirs = reinterpret_cast<const uint16_t*>(op.scratch.get());
    for (int i = 0; i < x.count; ++i) mine[i] = mine_first ? add_bf16(mine[i], theirs[i]) : add_bf16(theirs[i], mine[i]);
  } else {
    auto* mine = reinterpret_cast<float*>(x.data);
    const auto* theirs = reinterpret_cast<const float*>(op.scratch.get());
    for (int i = 0; i < x.count; ++i) mine[i] = mine_first ? mine[i] + theirs[i] : theirs[i] + mine[i];
  }
  x.step <<= 1;
  *finished = x.step >= x.size;
  return *finished ? MPI_SUCCESS : post_exchange(x, op);
}

}  // namespace

struct MpiCommunicator::Group {
  explicit Group(CommOptions o) : options(o) {}
  ~Group();

  // What a collective is called in errors ("all_reduce #7 on rank 1 of 2"), formed
  // only when one is reported.
  struct Label {
    const Group& group;
    const char* name;
    uint64_t seq;
    std::string str() const { return group.label(name, seq); }
  };

  // "all_reduce #7 on rank 1 of 2" in `text`, without allocating: every collective
  // needs it at hand for its errors, and few ever report one.
  using LabelText = std::array<char, 96>;
  std::string_view label_text(const char* name, uint64_t seq, LabelText& text) const {
    char* p = text.data();
    char* const end = text.data() + text.size();
    auto put = [&](std::string_view s) {
      const size_t n = std::min(s.size(), static_cast<size_t>(end - p));
      p = std::copy_n(s.data(), n, p);
    };
    auto number = [&](uint64_t v) { p = std::to_chars(p, end, v).ptr; };
    put(name);
    put(" #");
    number(seq);
    put(" on rank ");
    number(static_cast<uint64_t>(rank));
    put(" of ");
    number(static_cast<uint64_t>(size));
    return {text.data(), static_cast<size_t>(p - text.data())};
  }
  std::string label(const char* name, uint64_t seq) const {
    LabelText text;
    return std::string(label_text(name, seq, text));
  }
  // The number the next stream collective gets; call with issue_mu held.
  uint64_t next_seq() const { return issued + 1; }
  // The label the next stream collective gets; call with issue_mu held.
  std::string next_label(const char* name) { return label(name, next_seq()); }
  // OK while stream collectives can still match their peers'.
  Status stream_usable(std::string_view what) {
    if (!broken.load(std::memory_order_acquire)) return ok_status();
    std::lock_guard<std::mutex> lock(mu);
    if (stream_broken.ok()) return ok_status();
    return failed_precondition(std::string(what) + ": the communicator is unusable since " + stream_broken.message());
  }
  // Its number is taken: the collective's host function is on the stream. Call with
  // issue_mu held.
  void commit(uint64_t bytes) {
    ++issued;
    issued_bytes += bytes;
  }
  // The first failure breaks them; call with mu held.
  void set_broken(const Status& why) {
    if (!stream_broken.ok()) return;
    stream_broken = why;
    broken.store(true, std::memory_order_release);
  }
  void break_stream(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      set_broken(why);
    }
    turn.notify_all();
  }

  // `abandoned` runs when MPI may still use the bytes after the collective gave up
  // on them (a timeout, an abort): they must then stay allocated until exit.
  Status run(const char* name, uint64_t seq, const Status& stream_error, const MpiBuffers& bytes,
             const StartCollective& start, const std::function<void()>& abandoned);
  Status wait_for_turn(uint64_t seq, Clock::time_point deadline, const Label& what);
  // `abandonable`: a stream collective, which abort() may give up on (agree() is not).
  Status poll(InFlight& op, Clock::time_point deadline, const Label& what, bool* timed_out, bool abandonable);
  // MPI may still write `op`'s scratch memory: it stays allocated until exit.
  void keep_scratch(const InFlight& op) {
    if (!op.scratch || hazard_on(Hazard::kReusesAbandonedMpiMemory)) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      kept_bytes += op.scratch_bytes;
    }
    keep_until_exit(op.scratch);
  }

  const CommOptions options;
  int rank = 0;
  int size = 0;
  // The largest tag MPI allows (at least 32767; Open MPI's is 2^31 - 1): exchange
  // messages carry their collective's number modulo this plus one.
  int tag_ub = 32767;
  MPI_Comm stream_comm = MPI_COMM_NULL;  // the streams' collectives
  MPI_Comm host_comm = MPI_COMM_NULL;    // agree(), which must not interleave with them
  MPI_Op bf16_sum = MPI_OP_NULL;
  const std::shared_ptr<StagingPool> staging = std::make_shared<StagingPool>();

  // One collective issued at a time: the number in its label is the one it runs under.
  std::mutex issue_mu;
  uint64_t issued = 0;        // stream collectives numbered so far (guarded by issue_mu)
  uint64_t issued_bytes = 0;  // of their views (guarded by issue_mu)
  std::mutex agree_mu;

  std::mutex mu;
  std::condition_variable turn;  // `started` moved or the stream collectives broke
  uint64_t started = 0;          // of them, those started in order (guarded by mu)
  Status stream_broken;          // the first failure of a stream collective (guarded by mu)
  // !stream_broken.ok(), readable without mu: issuers and pollers look at it every time.
  std::atomic<bool> broken{false};
  uint64_t agreements = 0;       // guarded by agree_mu
  Status host_broken;            // the first failure of agree() (guarded by agree_mu)
  uint64_t kept_bytes = 0;       // guarded by mu
};

MpiCommunicator::Group::~Group() {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  if (!mpi_usable()) return;
  if (bf16_sum != MPI_OP_NULL) MPI_Op_free(&bf16_sum);
  if (stream_comm != MPI_COMM_NULL) MPI_Comm_free(&stream_comm);
  if (host_comm != MPI_COMM_NULL) MPI_Comm_free(&host_comm);
}

// On the stream's thread. A stream that failed earlier never produced the input
// bytes, so the collective cannot take part: it is skipped, its peers time out, and
// the communicator breaks (the ranks' sequences no longer match).
Status MpiCommunicator::Group::run(const char* name, uint64_t seq, const Status& stream_error,
                                   const MpiBuffers& bytes, const StartCollective& start,
                                   const std::function<void()>& abandoned) {
  const Clock::time_point deadline = Clock::now() + options.timeout;
  const Label what{*this, name, seq};
  if (!stream_error.ok()) {
    Status skipped = failed_precondition(what.str() + " skipped: an earlier command of its stream failed: " +
                                         stream_error.message());
    break_stream(skipped);
    return skipped;
  }
  NPURT_RETURN_IF_ERROR(wait_for_turn(seq, deadline, what));
  InFlight op;
  op.tag = static_cast<int>(seq % (static_cast<uint64_t>(tag_ub) + 1));
  Status failed;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    if (const int err = start(stream_comm, bytes, &op); err != MPI_SUCCESS) failed = mpi_error(err, what.str());
  }
  if (!failed.ok()) {
    // A receive posted before the failed send may still be written.
    keep_scratch(op);
    break_stream(failed);
    return failed;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ++started;
  }
  turn.notify_all();
  bool timed_out = false;
  Status s = poll(op, deadline, what, &timed_out, /*abandonable=*/true);
  if (s.ok()) return s;
  if (timed_out) abandoned();
  keep_scratch(op);
  break_stream(s);
  return s;
}

// MPI matches collectives in the order each rank starts them: start in issue order.
Status MpiCommunicator::Group::wait_for_turn(uint64_t seq, Clock::time_point deadline, const Label& what) {
  std::unique_lock<std::mutex> lock(mu);
  const bool turn_came =
      turn.wait_until(lock, deadline, [&] { return started + 1 == seq || !stream_broken.ok(); });
  if (!stream_broken.ok()) {
    return failed_precondition(what.str() + ": the communicator is unusable since " + stream_broken.message());
  }
  if (turn_came) return ok_status();
  Status late = deadline_exceeded(what.str() + ": collective #" + std::to_string(started + 1) +
                                    " of this rank, issued before it on another stream, did not start within " +
                                    std::to_string(options.timeout.count()) + " ms");
  set_broken(late);
  lock.unlock();
  turn.notify_all();
  return late;
}

// Small collectives complete within microseconds, and MPI progresses nonblocking
// collectives only inside MPI calls: so this tests back to back for a while before it
// starts sleeping between tests. It yields the core only every 64 tests: a yield per
// test handed the core to spinning threads for most of the time a 2.5 KiB all-reduce
// takes (25 vs 7 us on 2 ranks of a 2-core host, docs/parallel.md), yet a thread
// that needs the core still gets it.
Status MpiCommunicator::Group::poll(InFlight& op, Clock::time_point deadline, const Label& what, bool* timed_out,
                                    bool abandonable) {
  constexpr auto kBusyFor = std::chrono::milliseconds(50);
  constexpr auto kLongestNap = std::chrono::microseconds(1000);
  Clock::time_point busy_until;  // from the first test that finds it still running
  auto nap = std::chrono::microseconds(50);
  for (uint32_t tests = 1;; ++tests) {
    int done = 0;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      int err = MPI_Testall(2, op.requests, &done, MPI_STATUSES_IGNORE);
      if (err == MPI_SUCCESS && done != 0 && op.exchange) {
        bool finished = false;
        err = next_exchange_step(op, &finished);
        if (!finished) done = 0;  // the next step is posted: test it at once
      }
      if (err != MPI_SUCCESS) return mpi_error(err, what.str());
    }
    if (done != 0) return ok_status();
    const Clock::time_point now = Clock::now();
    if (tests == 1) busy_until = now + kBusyFor;
    if (now >= deadline) {
      *timed_out = true;
      return deadline_exceeded(what.str() + ": peers did not arrive within " + std::to_string(options.timeout.count()) +
                               " ms");
    }
    if (abandonable && broken.load(std::memory_order_acquire)) {
      // abort() gave up on it: MPI may still write the staging memory, as after a timeout.
      std::lock_guard<std::mutex> lock(mu);
      if (!stream_broken.ok()) {
        *timed_out = true;
        return failed_precondition(what.str() + ": abandoned: " + stream_broken.message());
      }
    }
    if (now < busy_until) {
      if (tests % 64 == 0) std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, kLongestNap);
    }
  }
}

// ---- the session ----

StatusOr<std::unique_ptr<MpiSession>> MpiSession::init(int* argc, char*** argv) {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized != 0) return failed_precondition("mpi_init: MPI is initialized already");
  // The collectives run nonblocking (a timeout needs that), and Open MPI's default
  // MPI_Iallreduce algorithm on few ranks moves megabytes at half the speed of its
  // blocking one; its ring does not (docs/parallel.md, figures). A value the user set
  // (the environment, mpirun --mca) wins; other MPIs ignore the name.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
  int provided = MPI_THREAD_SINGLE;
  const int err = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (err != MPI_SUCCESS) return failed_precondition("mpi_init: MPI_Init_thread failed (error " + std::to_string(err) + ")");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return failed_precondition("mpi_init: MPI provides thread level " + std::to_string(provided) +
                               ", npurt needs at least MPI_THREAD_SERIALIZED (" +
                               std::to_string(MPI_THREAD_SERIALIZED) + "): collectives run on stream threads");
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<MpiSession>(new MpiSession(rank, size, provided));
}

MpiSession::~MpiSession() {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  if (mpi_usable()) MPI_Finalize();
}

// ---- the communicator ----

StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::create(std::shared_ptr<Runtime> runtime,
                                                                   CommOptions options) {
  if (!runtime) return invalid_argument("MpiCommunicator::create: no runtime");
  NPURT_RETURN_IF_ERROR(runtime->check_open("MpiCommunicator::create"));
  if (options.timeout.count() <= 0) return invalid_argument("MpiCommunicator::create: the timeout must be positive");
  auto group = std::make_shared<Group>(options);
  std::lock_guard<std::mutex> lock(mpi_mutex());
  if (!mpi_usable()) return failed_precondition("MpiCommunicator::create: MPI is not initialized (comm::mpi_init)");
  for (MPI_Comm* comm : {&group->stream_comm, &group->host_comm}) {
    int err = MPI_Comm_dup(MPI_COMM_WORLD, comm);
    if (err == MPI_SUCCESS) err = MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
    if (err != MPI_SUCCESS) return mpi_error(err, "MpiCommunicator::create: duplicating MPI_COMM_WORLD");
  }
  MPI_Comm_rank(group->stream_comm, &group->rank);
  MPI_Comm_size(group->stream_comm, &group->size);
  int* tag_ub = nullptr;
  int has_tag_ub = 0;
  if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &has_tag_ub) == MPI_SUCCESS && has_tag_ub != 0 &&
      *tag_ub > group->tag_ub) {
    group->tag_ub = *tag_ub;
  }
  if (const int err = MPI_Op_create(&sum_bf16, /*commute=*/1, &group->bf16_sum); err != MPI_SUCCESS) {
    return mpi_error(err, "MpiCommunicator::create: the bf16 sum");
  }
  return std::shared_ptr<MpiCommunicator>(new MpiCommunicator(std::move(runtime), std::move(group)));
}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return group_->rank; }
int MpiCommunicator::size() const { return group_->size; }

void MpiCommunicator::abort(const Status& why) {
  group_->break_stream(why.with_context("rank " + std::to_string(group_->rank) + " aborted its collectives"));
}

CommStats MpiCommunicator::stats() const {
  CommStats s;
  {
    std::lock_guard<std::mutex> lock(group_->issue_mu);
    s.collectives = group_->issued;
    s.bytes = group_->issued_bytes;
  }
  std::lock_guard<std::mutex> lock(group_->mu);
  s.kept_bytes = group_->kept_bytes;
  return s;
}

namespace {

// How a collective's bytes travel. Staged: which device range (by argument index) is
// copied into host staging memory before MPI runs and where, and which is written
// back afterwards from the start of the staging memory. Device-direct: which ranges
// MPI sends from and receives into (the same one: in place).
struct Staging {
  uint64_t bytes = 0;
  std::optional<size_t> download;  // argument copied to the host
  uint64_t download_offset = 0;
  std::optional<size_t> upload;    // argument written from the host
  size_t send = 0;                 // device-direct
  size_t recv = 0;
};

Status enqueue_staged(hal::Device& device, hal::StreamId stream, std::span<const hal::KernelArg> ranges,
                      const Staging& plan, const std::shared_ptr<uint8_t>& bytes,
                      const std::function<Status()>& enqueue_mpi, const std::function<void()>& committed) {
  if (plan.download) {
    const hal::KernelArg& src = ranges[*plan.download];
    NPURT_RETURN_IF_ERROR(device.copy_to_host(stream, bytes.get() + plan.download_offset, src.addr, src.bytes));
  }
  if (Status s = enqueue_mpi(); !s.ok()) {
    // The download writes into the staging memory: it must be over before it goes.
    if (plan.download) device.stream_synchronize(stream).ignore();
    return s;
  }
  committed();
  if (!plan.upload) return ok_status();
  const hal::KernelArg& dst = ranges[*plan.upload];
  NPURT_RETURN_IF_ERROR(device.copy_to_device(stream, dst.addr, bytes.get(), dst.bytes));
  // The upload reads the staging memory until it ran: hold it until then.
  Status s = device.enqueue_host_function(stream, [bytes](const Status&) { return ok_status(); });
  if (!s.ok()) device.stream_synchronize(stream).ignore();
  return s;
}

// The device bytes themselves, resolved when the stream reaches the collective (its
// views' allocations are alive then: the memory context holds their frees until the
// command is done).
StatusOr<MpiBuffers> device_buffers(hal::Device& device, const hal::KernelArg& send, const hal::KernelArg& recv) {
  NPURT_ASSIGN_OR_RETURN(uint8_t* r, device.host_address(recv.addr, recv.bytes, /*writes=*/true));
  if (send.addr == recv.addr) return MpiBuffers{r, r};
  NPURT_ASSIGN_OR_RETURN(uint8_t* w, device.host_address(send.addr, send.bytes, /*writes=*/false));
  return MpiBuffers{w, r};
}

// Device-direct: one host function runs MPI on the views' own bytes. After a timeout
// MPI may still write them, so their blocks are kept until exit.
Status enqueue_direct(Runtime& runtime, const std::shared_ptr<MpiCommunicator::Group>& group, const char* name,
                      uint64_t seq, hal::StreamId stream, std::span<const hal::KernelArg> ranges,
                      std::span<const MemoryContext::CommandArg> args, const Staging& plan,
                      StartCollective start) {
  std::shared_ptr<hal::Device> device = runtime.shared_device();
  // A collective has one or two views (all_gather: local and gathered).
  struct Abandon {
    MemoryContext* memory;  // outlives the stream's commands
    std::array<View, 2> views;
    bool retain = !hazard_on(Hazard::kReusesAbandonedMpiMemory);
    void operator()() const {
      if (!retain) return;
      for (const View& v : views) {
        if (!v.empty()) memory->retain_until_exit(v).ignore();
      }
    }
  } abandoned{&runtime.memory(), {}};
  for (size_t i = 0; i < args.size() && i < abandoned.views.size(); ++i) abandoned.views[i] = args[i].view;
  const hal::KernelArg send = ranges[plan.send], recv = ranges[plan.recv];
  return device->enqueue_host_function(
      stream, [group, name, seq, device, send, recv, start = std::move(start),
               abandoned = std::move(abandoned)](const Status& stream_error) -> Status {
        StatusOr<MpiBuffers> bytes = MpiBuffers{};
        if (stream_error.ok()) bytes = device_buffers(*device, send, recv);
        if (!bytes.ok()) {
          const Status failed = bytes.status().with_context(group->label(name, seq));
          group->break_stream(failed);
          return failed;
        }
        return group->run(name, seq, stream_error, *bytes, start, abandoned);
      });
}

// Issues one stream collective over `args`: checks, then (through the memory
// context, which orders it and syncs the views) its MPI, on the views' device bytes
// where the device allows it, else through staging copies.
Status issue_collective(Runtime& runtime, const std::shared_ptr<MpiCommunicator::Group>& group, const char* name,
                        hal::StreamId stream, std::span<const MemoryContext::CommandArg> args, const Staging& plan,
                        uint64_t view_bytes, StartCollective start) {
  std::lock_guard<std::mutex> issue(group->issue_mu);
  const uint64_t seq = group->next_seq();
  MpiCommunicator::Group::LabelText text;
  const std::string_view what = group->label_text(name, seq, text);
  NPURT_RETURN_IF_ERROR(runtime.check_open(what));
  NPURT_RETURN_IF_ERROR(group->stream_usable(what));
  const bool direct = group->options.device_direct && runtime.device().info().host_addressable_memory;
  return runtime.memory().enqueue_command(
      stream, what, args, [&](hal::StreamId s, std::span<const hal::KernelArg> ranges) -> Status {
        if (direct) {
          NPURT_RETURN_IF_ERROR(enqueue_direct(runtime, group, name, seq, s, ranges, args, plan, std::move(start)));
          group->commit(view_bytes);
          return ok_status();
        }
        hal::Device& device = runtime.device();
        std::shared_ptr<uint8_t> bytes = group->staging->take(plan.bytes);
        auto enqueue_mpi = [&] {
          return device.enqueue_host_function(s, [group, name, seq, bytes, start = std::move(start)](
                                                     const Status& stream_error) {
            const MpiBuffers staged{bytes.get(), bytes.get()};
            return group->run(name, seq, stream_error, staged, start, [bytes] { keep_until_exit(bytes); });
          });
        };
        return enqueue_staged(device, s, ranges, plan, bytes, enqueue_mpi, [&] { group->commit(view_bytes); });
      });
}

}  // namespace

Status MpiCommunicator::all_reduce(hal::StreamId stream, const View& data, isa::DType dtype) {
  const uint64_t element = reduce_element_bytes(dtype);
  auto bad = [&](const std::string& why) {
    std::lock_guard<std::mutex> issue(group_->issue_mu);
    return invalid_argument(group_->next_label("all_reduce") + ": " + why);
  };
  if (element == 0) {
    return bad("dtype " + std::string(isa::dtype_name(dtype)) + " cannot be summed (f32 or bf16 only)");
  }
  if (data.size() % element != 0) {
    return bad(std::to_string(data.size()) + " bytes are not a whole number of " +
               std::string(isa::dtype_name(dtype)) + " elements");
  }
  const uint64_t count = data.size() / element;
  if (count > static_cast<uint64_t>(INT_MAX)) return bad(std::to_string(count) + " elements are more than one MPI call takes");
  const MPI_Datatype type = dtype == isa::DType::kF32 ? MPI_FLOAT : MPI_UINT16_T;
  const MPI_Op op = dtype == isa::DType::kF32 ? MPI_SUM : group_->bf16_sum;
  const MemoryContext::CommandArg args[] = {{data, isa::Access::kInOut}};
  const Staging plan{.bytes = data.size(), .download = 0, .upload = 0, .send = 0, .recv = 0};
  const int n = size();
  if (n > 1 && (n & (n - 1)) == 0 && data.size() <= kExchangeMaxBytes) {
    const ExchangeSum x{.count = static_cast<int>(count),
                        .type = type,
                        .bf16 = dtype == isa::DType::kBF16,
                        .rank = rank(),
                        .size = n};
    const uint64_t bytes = data.size();
    return issue_collective(*runtime_, group_, "all_reduce", stream, args, plan, bytes,
                            [x, bytes](MPI_Comm comm, const MpiBuffers& b, InFlight* op) {
                              ExchangeSum in_place = x;
                              in_place.comm = comm;
                              in_place.data = b.recv;
                              return start_exchange(in_place, bytes, *op);
                            });
  }
  return issue_collective(*runtime_, group_, "all_reduce", stream, args, plan, data.size(),
                          [count, type, op](MPI_Comm comm, const MpiBuffers& b, InFlight* in_flight) {
                            return MPI_Iallreduce(MPI_IN_PLACE, b.recv, static_cast<int>(count), type, op, comm,
                                                  &in_flight->requests[0]);
                          });
}

Status MpiCommunicator::all_gather(hal::StreamId stream, const View& local, const View& gathered) {
  const uint64_t n = local.size();
  auto bad = [&](const std::string& why) {
    std::lock_guard<std::mutex> issue(group_->issue_mu);
    return invalid_argument(group_->next_label("all_gather") + ": " + why);
  };
  if (gathered.size() != n * static_cast<uint64_t>(size())) {
    return bad("gathered holds " + std::to_string(gathered.size()) + " bytes, not " + std::to_string(size()) +
               " x " + std::to_string(n));
  }
  if (n > static_cast<uint64_t>(INT_MAX)) return bad(std::to_string(n) + " bytes per rank are more than one MPI call takes");
  if (local.overlaps(gathered)) return bad("local and gathered overlap");
  const MemoryContext::CommandArg args[] = {{local, isa::Access::kIn}, {gathered, isa::Access::kOut}};
  // Staged, the local bytes go straight to their place among the gathered ones
  // (MPI_IN_PLACE); device-direct, MPI reads them from `local`.
  const Staging plan{.bytes = gathered.size(),
                     .download = 0,
                     .download_offset = n * static_cast<uint64_t>(rank()),
                     .upload = 1,
                     .send = 0,
                     .recv = 1};
  return issue_collective(*runtime_, group_, "all_gather", stream, args, plan, n + gathered.size(),
                          [n](MPI_Comm comm, const MpiBuffers& b, InFlight* op) {
                            MPI_Request* request = &op->requests[0];
                            const int count = static_cast<int>(n);
                            if (b.send == b.recv) {
                              return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, b.recv, count, MPI_BYTE,
                                                    comm, request);
                            }
                            return MPI_Iallgather(b.send, count, MPI_BYTE, b.recv, count, MPI_BYTE, comm, request);
                          });
}

Status MpiCommunicator::broadcast(hal::StreamId stream, const View& data, int root) {
  auto bad = [&](const std::string& why) {
    std::lock_guard<std::mutex> issue(group_->issue_mu);
    return invalid_argument(group_->next_label("broadcast") + ": " + why);
  };
  if (root < 0 || root >= size()) {
    return bad("root " + std::to_string(root) + " is not a rank of 0.." + std::to_string(size() - 1));
  }
  if (data.size() > static_cast<uint64_t>(INT_MAX)) return bad(std::to_string(data.size()) + " bytes are more than one MPI call takes");
  // The root's bytes do not change; the others' are all overwritten.
  const bool is_root = root == rank();
  const MemoryContext::CommandArg args[] = {{data, is_root ? isa::Access::kIn : isa::Access::kOut}};
  Staging plan;
  plan.bytes = data.size();
  if (is_root) {
    plan.download = 0;
  } else {
    plan.upload = 0;
  }
  const int count = static_cast<int>(data.size());
  return issue_collective(*runtime_, group_, "broadcast", stream, args, plan, data.size(),
                          [count, root](MPI_Comm comm, const MpiBuffers& b, InFlight* op) {
                            return MPI_Ibcast(b.recv, count, MPI_BYTE, root, comm, &op->requests[0]);
                          });
}

// No views: straight onto the stream, still numbered and started in order.
Status MpiCommunicator::barrier(hal::StreamId stream) {
  std::lock_guard<std::mutex> issue(group_->issue_mu);
  const uint64_t seq = group_->next_seq();
  Group::LabelText text;
  const std::string_view what = group_->label_text("barrier", seq, text);
  NPURT_RETURN_IF_ERROR(runtime_->check_open(what));
  NPURT_RETURN_IF_ERROR(group_->stream_usable(what));
  std::shared_ptr<Group> group = group_;
  StartCollective start = [](MPI_Comm comm, const MpiBuffers&, InFlight* op) {
    return MPI_Ibarrier(comm, &op->requests[0]);
  };
  Status s = runtime_->device().enqueue_host_function(stream, [group, seq, start](const Status& stream_error) {
    return group->run("barrier", seq, stream_error, MpiBuffers{}, start, [] {});
  });
  if (!s.ok()) return s.with_context(what);
  group_->commit(0);
  return ok_status();
}

namespace {

// One rank's status as agree() exchanges it.
struct StatusRecord {
  static constexpr size_t kMessageBytes = 512;
  int32_t code = 0;
  uint32_t length = 0;
  char message[kMessageBytes] = {};
};

StatusRecord record_of(const Status& s) {
  StatusRecord r;
  r.code = static_cast<int32_t>(s.code());
  r.length = static_cast<uint32_t>(std::min(s.message().size(), StatusRecord::kMessageBytes));
  std::memcpy(r.message, s.message().data(), r.length);
  return r;
}

Status status_of(const StatusRecord& r, int rank) {
  const bool known = r.code > 0 && r.code <= static_cast<int32_t>(StatusCode::kAborted);
  const StatusCode code = known ? static_cast<StatusCode>(r.code) : StatusCode::kInternal;
  const size_t length = std::min<size_t>(r.length, StatusRecord::kMessageBytes);
  return Status(code, "rank " + std::to_string(rank) + ": " + std::string(r.message, length));
}

}  // namespace

Status MpiCommunicator::agree(const Status& mine) {
  std::lock_guard<std::mutex> one_at_a_time(group_->agree_mu);
  const Group::Label label{*group_, "agree", ++group_->agreements};
  const std::string what = label.str();
  if (!group_->host_broken.ok()) {
    return failed_precondition(what + ": agree() is unusable since " + group_->host_broken.message());
  }
  // Shared: when peers do not arrive, MPI may still write it later.
  auto records = std::make_shared<std::vector<StatusRecord>>(static_cast<size_t>(size()));
  (*records)[static_cast<size_t>(rank())] = record_of(mine);
  InFlight op;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    const int err = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, records->data(), sizeof(StatusRecord),
                                   MPI_BYTE, group_->host_comm, &op.requests[0]);
    if (err != MPI_SUCCESS) return group_->host_broken = mpi_error(err, what);
  }
  bool timed_out = false;
  Status s = group_->poll(op, Clock::now() + group_->options.timeout, label, &timed_out, /*abandonable=*/false);
  if (!s.ok()) {
    if (timed_out) keep_until_exit(records);
    return group_->host_broken = s;
  }
  for (int r = 0; r < size(); ++r) {
    const StatusRecord& record = (*records)[static_cast<size_t>(r)];
    if (record.code != 0) return status_of(record, r);
  }
  return ok_status();
}

}  // namespace npurt::comm
