// The in-process backend: ranks exchange bytes by peer copies into each other's
// landing zones and meet in host functions on their streams.
//
// One exchange round of rank r (round k, parity p = k % 2):
//   1. push: copy this rank's piece into slot (p, r) of every rank's landing zone
//      (its own by an on-device copy);
//   2. arrive, then wait: one host function on the stream marks r arrived at k (it
//      never blocks), the next waits until every rank arrived at k, so every piece of
//      round k is in every zone. A thread waiting there runs a missing peer's queued
//      push and arrival itself where the peer's stream lets it (help_rank), instead
//      of waiting for that stream's thread to wake;
//   3. consume: on-device work reads the zone (the sum kernels, or copies out).
// Zones are double-buffered by parity: rank r's push of round k lands in a half that
// its owner last read in round k - 2, which the owner finished before arriving at
// round k - 1, which rank r waited for before pushing. So one meeting per round.

#include "npurt/comm/device_group.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>

#include "comm/meeting.h"
#include "npurt/base/hazards.h"
#include "npurt/hal/handles.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/elementwise.h"

namespace npurt::comm {

using isa::Access;
using isa::DType;

namespace group_detail {

// One rank's kernel that adds two vectors of up to chunk_bytes (count a runtime scalar).
struct Adder {
  exec::CodeHandle code;
  uint32_t grid = 1;
};

struct RankState {
  std::shared_ptr<Runtime> runtime;
  hal::DeviceBlock landing;  // 2 x size x chunk_bytes
  Adder add_f32, add_bf16;
  // Hazard::kCollectivesSkipOrdering only: where pushes skip the stream's order.
  std::shared_ptr<exec::StreamPool> side;
};

struct GroupState {
  GroupState(int n, CommOptions o) : options(o), meeting(n, o.timeout), round_streams(n) {}
  const CommOptions options;
  bool host_sums = false;  // options.host_sums, and every device's memory is host-addressable
  std::vector<RankState> ranks;
  Meeting meeting;
  // Each rank's enqueued rounds small enough to help that it has not arrived at yet,
  // oldest first, so a rank waiting at the meeting can run a peer's part (help_rank).
  struct PendingRound {
    uint64_t round;
    hal::StreamId stream;
    uint64_t first;  // the stream position of the round's first command
  };
  std::mutex round_streams_mu;
  std::vector<std::deque<PendingRound>> round_streams;  // guarded by round_streams_mu
};

}  // namespace group_detail

namespace {

using group_detail::Adder;
using group_detail::GroupState;
using group_detail::RankState;

// Rounds whose pieces are larger are not helped: their pushes take longer than a
// stream thread's wake-up, and one thread running every rank's copies in turn would
// serialize what the ranks' threads copy side by side.
constexpr uint64_t kHelpedRoundBytes = 64 << 10;

// Notes that `rank`'s `round` (pieces of `bytes`) is about to be enqueued on `stream`,
// forgetting the rounds it has arrived at. A round too large to help, or without the
// stream's position (a driver that does not count), is not noted: no peer helps it.
void note_round_stream(GroupState& g, int rank, uint64_t round, hal::StreamId stream, uint64_t bytes) {
  if (bytes > kHelpedRoundBytes) return;
  const StatusOr<uint64_t> first = g.ranks[rank].runtime->device().stream_position(stream);
  if (!first.ok()) return;
  std::lock_guard<std::mutex> lock(g.round_streams_mu);
  auto& rounds = g.round_streams[rank];
  while (!rounds.empty() && g.meeting.arrived(rank, rounds.front().round)) rounds.pop_front();
  rounds.push_back({round, stream, *first});
}

// Meeting::Help: runs `rank`'s next queued command of `round` on this thread, when its
// stream lets a host thread run it and the round was noted. Every rank has arrived at
// the rounds before `round` (the caller's rank has arrived at `round`), so their
// entries go. Only the round's own commands up to the peer's arrival are taken: none
// before the round's first (the peer's other work, which may block or be large), none
// once the peer has arrived (its wait, which may block).
bool help_rank(GroupState& g, int rank, uint64_t round) {
  hal::StreamId stream;
  uint64_t first = 0;
  {
    std::lock_guard<std::mutex> lock(g.round_streams_mu);
    auto& rounds = g.round_streams[rank];
    while (!rounds.empty() && rounds.front().round < round) rounds.pop_front();
    if (rounds.empty() || rounds.front().round != round) return false;
    stream = rounds.front().stream;
    first = rounds.front().first;
  }
  const StatusOr<bool> ran = g.ranks[rank].runtime->device().run_next_command(
      stream, [&g, rank, round, first](uint64_t position) {
        return position >= first && !g.meeting.arrived(rank, round);
      });
  return ran.ok() && *ran;
}

// Waits at the meeting for every rank's arrival at `round`, running missing peers'
// parts meanwhile.
Status meet(GroupState& g, int rank, uint64_t round, const std::string& what) {
  return g.meeting.wait(rank, round, what, [&g](int peer, uint64_t at) { return help_rank(g, peer, at); });
}

StatusOr<Adder> make_adder(Runtime& rt, DType dtype, uint64_t chunk_bytes) {
  const uint64_t n = chunk_bytes / reduce_element_bytes(dtype);
  const ops::Elementwise add(
      ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = n, .dtype = dtype, .row_elems = 1});
  NPURT_ASSIGN_OR_RETURN(ops::Kernel k, add.compile(ops::Target::of(rt.device().info())));
  NPURT_ASSIGN_OR_RETURN(exec::CodeHandle code, rt.registry().register_image(k.image));
  return Adder{std::move(code), k.grid};
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<GroupState> group, int rank) : g_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(g_->ranks.size()); }
  const char* backend() const override { return "in-process"; }
  Runtime& runtime() const override { return *self().runtime; }

  Status all_reduce(hal::StreamId stream, const View& data, DType dtype) override {
    const uint64_t esize = reduce_element_bytes(dtype);
    if (esize == 0) {
      return invalid_argument("all_reduce: dtype " + std::string(isa::dtype_name(dtype)) +
                              " cannot be summed (f32 or bf16)");
    }
    if (data.size() % esize != 0) {
      return invalid_argument("all_reduce: a view of " + std::to_string(data.size()) + " bytes is not a whole number of " +
                              std::string(isa::dtype_name(dtype)) + " elements");
    }
    const Adder& adder = dtype == DType::kF32 ? self().add_f32 : self().add_bf16;
    const MemoryContext::CommandArg args[] = {{data, Access::kInOut}};
    return collective("all_reduce", stream, args, data.size(), [&](const Round& r) -> Status {
      const hal::DeviceAddr piece = r.views[0].addr + r.offset;
      if (g_->host_sums) {
        NPURT_RETURN_IF_ERROR(push(r, piece, /*own_slot=*/false));
        return arrive_and_sum(r, piece, dtype);
      }
      NPURT_RETURN_IF_ERROR(push(r, piece));
      NPURT_RETURN_IF_ERROR(arrive(r));
      // Ranks added in rank order, the same on every device: every device ends with
      // the same bits.
      const int64_t count = static_cast<int64_t>(r.length / esize);
      for (int j = 1; j < size(); ++j) {
        const hal::DeviceAddr a = j == 1 ? slot(rank_, 0, r.round) : piece;
        const hal::LaunchParams p{adder.code.address(), adder.grid,
                                  {hal::KernelArg::buffer(a, r.length),
                                   hal::KernelArg::buffer(slot(rank_, j, r.round), r.length),
                                   hal::KernelArg::buffer(piece, r.length), hal::KernelArg::scalar_i64(count)}};
        NPURT_RETURN_IF_ERROR(device().launch(r.stream, p));
      }
      return ok_status();
    });
  }

  Status all_gather(hal::StreamId stream, const View& local, const View& gathered) override {
    if (gathered.size() != local.size() * static_cast<uint64_t>(size())) {
      return invalid_argument("all_gather: the gathered view holds " + std::to_string(gathered.size()) +
                              " bytes; " + std::to_string(size()) + " ranks of " + std::to_string(local.size()) +
                              " need " + std::to_string(local.size() * size()));
    }
    const MemoryContext::CommandArg args[] = {{local, Access::kIn}, {gathered, Access::kOut}};
    return collective("all_gather", stream, args, local.size(), [&](const Round& r) -> Status {
      NPURT_RETURN_IF_ERROR(push(r, r.views[0].addr + r.offset));
      NPURT_RETURN_IF_ERROR(arrive(r));
      for (int j = 0; j < size(); ++j) {
        const hal::DeviceAddr dst = r.views[1].addr + j * local.size() + r.offset;
        NPURT_RETURN_IF_ERROR(device().copy_on_device(r.stream, dst, slot(rank_, j, r.round), r.length));
      }
      return ok_status();
    });
  }

  Status broadcast(hal::StreamId stream, const View& data, int root) override {
    if (root < 0 || root >= size()) {
      return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank of " +
                              std::to_string(size()));
    }
    const bool sends = root == rank_;
    const MemoryContext::CommandArg args[] = {{data, sends ? Access::kIn : Access::kOut}};
    return collective("broadcast", stream, args, data.size(), [&](const Round& r) -> Status {
      if (sends) NPURT_RETURN_IF_ERROR(push(r, r.views[0].addr + r.offset));
      NPURT_RETURN_IF_ERROR(arrive(r));
      if (sends) return ok_status();
      return device().copy_on_device(r.stream, r.views[0].addr + r.offset, slot(rank_, root, r.round), r.length);
    });
  }

  Status barrier(hal::StreamId stream) override {
    return collective("barrier", stream, {}, 0, [&](const Round& r) { return arrive(r); });
  }

  Status agree(const Status& mine) override { return mine; }

  void abort(const Status& why) override {
    g_->meeting.abort(why.with_context("rank " + std::to_string(rank_) + " aborted the group"));
  }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  // One exchange round as the collective's round function sees it.
  struct Round {
    hal::StreamId stream;
    uint64_t round;   // the group-wide round number
    uint64_t offset;  // into each rank's piece
    uint64_t length;  // bytes of it in this round
    std::span<const hal::KernelArg> views;
    const std::string& what;
  };

  const RankState& self() const { return g_->ranks[rank_]; }
  hal::Device& device() const { return self().runtime->device(); }

  // Slot `from` of `owner`'s landing zone, in the half of `round`'s parity.
  hal::DeviceAddr slot(int owner, int from, uint64_t round) const {
    const uint64_t half = (round & 1) * static_cast<uint64_t>(size());
    return g_->ranks[owner].landing.addr() + (half + from) * g_->options.chunk_bytes;
  }

  // Step 1: this rank's piece into its slot of every zone (its own zone's slot only
  // with `own_slot`).
  Status push(const Round& r, hal::DeviceAddr piece, bool own_slot = true) {
    if (!hazard_on(Hazard::kCollectivesSkipOrdering)) return push_on(r.stream, r, piece, own_slot);
    // WRONG on purpose: the pushes run on a side stream that does not wait for the
    // stream's earlier work (the host waits for them instead).
    RankState& me = g_->ranks[rank_];
    if (!me.side) {
      NPURT_ASSIGN_OR_RETURN(me.side, me.runtime->make_stream_pool("rank " + std::to_string(rank_) + " side"));
    }
    NPURT_ASSIGN_OR_RETURN(exec::SlotLease lease, me.side->acquire());
    const Status pushed = push_on(lease.stream, r, piece, own_slot);
    const Status finished = me.side->finish(lease);
    return pushed.ok() ? finished : pushed;
  }

  Status push_on(hal::StreamId on, const Round& r, hal::DeviceAddr piece, bool own_slot) {
    for (int j = 0; j < size(); ++j) {
      if (j == rank_ && !own_slot) continue;
      const hal::DeviceAddr dst = slot(j, rank_, r.round);
      NPURT_RETURN_IF_ERROR(j == rank_ ? device().copy_on_device(on, dst, piece, r.length)
                                       : device().copy_to_peer(on, g_->ranks[j].runtime->shared_device(), dst,
                                                               piece, r.length));
    }
    return ok_status();
  }

  // Enqueues `step` (a Status() callable) as a host function of round `r`; when the
  // stream failed before it, the peers are told instead (they would wait in vain).
  template <typename Step>
  Status enqueue_round_step(const Round& r, Step step) {
    return device().enqueue_host_function(
        r.stream, [group = g_, rank = rank_, what = r.what, step = std::move(step)](const Status& failed) -> Status {
          if (!failed.ok()) {
            group->meeting.fail(rank, failed, what);
            return failed;
          }
          return step();
        });
  }

  // Step 2, first half: this rank has pushed its piece of the round. It never
  // blocks, so a peer waiting at the meeting may run it (help_rank).
  Status enqueue_arrival(const Round& r) {
    return enqueue_round_step(r, [group = g_, rank = rank_, round = r.round] {
      return group->meeting.arrive(rank, round);
    });
  }

  // Step 2: meet the other ranks, in stream order.
  Status arrive(const Round& r) {
    NPURT_RETURN_IF_ERROR(enqueue_arrival(r));
    return enqueue_round_step(
        r, [group = g_, rank = rank_, round = r.round, what = r.what] { return meet(*group, rank, round, what); });
  }

  // Steps 2 and 3 of all_reduce at once, in stream order: meet the peers,
  // then add the ranks' pieces in rank order into `piece`, each addition rounded as
  // the sum kernel rounds it (f32; bf16 from f32 sums, nearest even), so the bytes are
  // the kernels' and every rank gets the same. Memory-speed adds instead of a launch
  // per peer. This rank's own piece is read where it is (push skipped its slot), and
  // that free slot holds the partial sums, so `piece` is written only by the last add.
  Status arrive_and_sum(const Round& r, hal::DeviceAddr piece, DType dtype) {
    NPURT_RETURN_IF_ERROR(enqueue_arrival(r));
    const uint64_t length = r.length, stride = g_->options.chunk_bytes;
    const hal::DeviceAddr slots = slot(rank_, 0, r.round);
    return enqueue_round_step(r, [group = g_, rank = rank_, round = r.round, what = r.what,
                                  device = self().runtime->shared_device(), piece, slots, length, stride,
                                  dtype]() -> Status {
      NPURT_RETURN_IF_ERROR(meet(*group, rank, round, what));
      const int n = static_cast<int>(group->ranks.size());
      NPURT_ASSIGN_OR_RETURN(uint8_t* zone, device->host_address(slots, stride * (n - 1) + length, true));
      NPURT_ASSIGN_OR_RETURN(uint8_t* out, device->host_address(piece, length, /*writes=*/true));
      auto from = [&](int j) { return j == rank ? out : zone + j * stride; };
      uint8_t* partial = zone + rank * stride;
      for (int j = 1; j < n; ++j) {
        add_into(dtype, j == n - 1 ? out : partial, j == 1 ? from(0) : partial, from(j), length);
      }
      return ok_status();
    });
  }

  // out = a + b over `bytes` of `dtype` (out may be a).
  static void add_into(DType dtype, uint8_t* out, const uint8_t* a, const uint8_t* b, uint64_t bytes) {
    if (dtype == DType::kF32) {
      const uint64_t n = bytes / 4;
      auto* o = reinterpret_cast<float*>(out);
      const auto* x = reinterpret_cast<const float*>(a);
      const auto* y = reinterpret_cast<const float*>(b);
      for (uint64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
      return;
    }
    const uint64_t n = bytes / 2;
    auto* o = reinterpret_cast<uint16_t*>(out);
    const auto* x = reinterpret_cast<const uint16_t*>(a);
    const auto* y = reinterpret_cast<const uint16_t*>(b);
    for (uint64_t i = 0; i < n; ++i) o[i] = isa::f32_to_bf16(isa::bf16_to_f32(x[i]) + isa::bf16_to_f32(y[i]));
  }

  using RoundFn = std::function<Status(const Round&)>;

  // A collective of `bytes` per rank, in rounds of at most chunk_bytes, ordered with
  // the views' other work by the memory context.
  Status collective(const char* kind, hal::StreamId stream, std::span<const MemoryContext::CommandArg> args,
                    uint64_t bytes, const RoundFn& each_round) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string what = std::string(kind) + " #" + std::to_string(seq_);
    NPURT_RETURN_IF_ERROR(self().runtime->check_open(what + " on rank " + std::to_string(rank_)));
    NPURT_RETURN_IF_ERROR(g_->meeting.failure().with_context(what + ": the group failed earlier"));
    const uint64_t chunk = g_->options.chunk_bytes;
    const uint64_t rounds = std::max<uint64_t>(1, (bytes + chunk - 1) / chunk);
    uint64_t enqueued = 0;
    Status s = runtime().memory().enqueue_command(
        stream, what, args, [&](hal::StreamId on, std::span<const hal::KernelArg> views) -> Status {
          if (size() == 1) return ok_status();  // a group of one has nothing to exchange
          for (; enqueued < rounds; ++enqueued) {
            const uint64_t offset = enqueued * chunk;
            const Round r{on, round_ + enqueued, offset, std::min(chunk, bytes - std::min(bytes, offset)), views, what};
            note_round_stream(*g_, rank_, r.round, on, r.length);
            NPURT_RETURN_IF_ERROR(each_round(r));
          }
          return ok_status();
        });
    // The peers expect this rank's rounds; without them theirs no longer line up.
    if (!s.ok()) g_->meeting.fail(rank_, s, what);
    NPURT_RETURN_IF_ERROR(s);
    ++seq_;
    round_ += size() == 1 ? 0 : rounds;
    ++stats_.collectives;
    stats_.bytes += bytes;
    return ok_status();
  }

  const std::shared_ptr<GroupState> g_;
  const int rank_;
  mutable std::mutex mu_;
  uint64_t seq_ = 0;    // collectives of this rank, guarded by mu_
  uint64_t round_ = 0;  // exchange rounds of this rank, guarded by mu_
  CommStats stats_;     // guarded by mu_
};

}  // namespace

StatusOr<std::shared_ptr<DeviceGroup>> DeviceGroup::create(std::vector<std::shared_ptr<Runtime>> runtimes,
                                                           CommOptions options) {
  if (runtimes.empty()) return invalid_argument("device group: no devices");
  if (options.chunk_bytes == 0 || options.chunk_bytes % 4096 != 0) {
    return invalid_argument("device group: chunk_bytes must be a positive multiple of 4096");
  }
  if (options.timeout.count() <= 0) return invalid_argument("device group: the timeout must be positive");
  const int n = static_cast<int>(runtimes.size());
  auto state = std::make_shared<GroupState>(n, options);
  state->host_sums = options.host_sums;
  for (int r = 0; r < n; ++r) {
    if (!runtimes[r]) return invalid_argument("device group: runtime " + std::to_string(r) + " is null");
    for (int j = 0; j < n; ++j) {
      state->host_sums &= runtimes[r]->device().info().host_addressable_memory;
      if (j != r && !runtimes[r]->device().can_access_peer(runtimes[j]->device())) {
        return invalid_argument("device group: device " + std::to_string(r) + " cannot reach device " +
                                std::to_string(j));
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    Runtime& rt = *runtimes[r];
    const std::string which = "device group: rank " + std::to_string(r);
    RankState rank{runtimes[r], {}, {}, {}, {}};
    auto landing = hal::DeviceBlock::allocate(rt.shared_device(), 2 * n * options.chunk_bytes, 4096);
    if (!landing.ok()) return landing.status().with_context(which + ": landing zone");
    rank.landing = std::move(landing).value();
    auto f32 = make_adder(rt, DType::kF32, options.chunk_bytes);
    if (!f32.ok()) return f32.status().with_context(which);
    rank.add_f32 = std::move(f32).value();
    auto bf16 = make_adder(rt, DType::kBF16, options.chunk_bytes);
    if (!bf16.ok()) return bf16.status().with_context(which);
    rank.add_bf16 = std::move(bf16).value();
    state->ranks.push_back(std::move(rank));
  }
  return std::shared_ptr<DeviceGroup>(new DeviceGroup(std::move(state)));
}

StatusOr<std::shared_ptr<DeviceGroup>> DeviceGroup::create(std::string_view driver, int devices,
                                                           const hal::DeviceSpec& spec, RuntimeOptions runtime,
                                                           CommOptions options) {
  if (devices < 1 || devices > 64) {
    return invalid_argument("device group: " + std::to_string(devices) + " devices (1 to 64)");
  }
  std::vector<std::shared_ptr<Runtime>> runtimes;
  for (int r = 0; r < devices; ++r) {
    auto rt = Runtime::create(driver, spec, runtime);
    if (!rt.ok()) return rt.status().with_context("device group: device " + std::to_string(r));
    runtimes.push_back(std::move(rt).value());
  }
  return create(std::move(runtimes), options);
}

DeviceGroup::DeviceGroup(std::shared_ptr<group_detail::GroupState> state) : state_(std::move(state)) {
  for (int r = 0; r < static_cast<int>(state_->ranks.size()); ++r) {
    communicators_.push_back(std::make_shared<InProcessCommunicator>(state_, r));
  }
}

int DeviceGroup::size() const { return static_cast<int>(state_->ranks.size()); }
Runtime& DeviceGroup::runtime(int rank) const { return *state_->ranks.at(rank).runtime; }
const std::shared_ptr<Runtime>& DeviceGroup::shared_runtime(int rank) const {
  return state_->ranks.at(rank).runtime;
}
std::shared_ptr<Communicator> DeviceGroup::communicator(int rank) const { return communicators_.at(rank); }

void DeviceGroup::close() {
  for (RankState& r : state_->ranks) r.runtime->close();
}


}  // namespace npurt::comm
