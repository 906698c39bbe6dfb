// Costs of host/device coherence (memory/), each next to its peer in the same run:
//   * bookkeeping per launch argument in steady state (nothing stale): a launch
//     through MemoryContext vs. the same launch plus its completion event issued
//     straight to the device, for 1 and 8 arguments, on a device where commands
//     cost nothing (so only the bookkeeping is measured) and on the simulator;
//     target <= 0.2 us per argument;
//   * bytes moved per dispatch of a kernel reading eight views of an input arena
//     when all views, one view, or no view was rewritten since the last dispatch,
//     vs. the always-correct peer that re-sends the whole arena every time;
//   * which write-tracking mechanism tracked mode uses here (the cost of a first
//     write to a protected page per mechanism is in write_tracker_bench.cc).

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hal/device_without_peers.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/builder.h"
#include "npurt/memory/memory_context.h"
#include "npurt/runtime/runtime.h"

namespace {

using namespace npurt;
using Clock = std::chrono::steady_clock;

// A kernel with `inputs` f32 `in` buffers and `outputs` f32 `out` buffers that does
// nothing: the device side of a launch is then as cheap as it gets.
isa::Image empty_kernel(int inputs, int outputs) {
  isa::KernelBuilder b("empty_" + std::to_string(inputs) + "_" + std::to_string(outputs));
  for (int i = 0; i < inputs; ++i) {
    b.arg_buffer("in" + std::to_string(i), isa::Access::kIn, isa::DType::kF32);
  }
  for (int i = 0; i < outputs; ++i) {
    b.arg_buffer("out" + std::to_string(i), isa::Access::kOut, isa::DType::kF32);
  }
  b.exit();
  return b.build().value();
}

struct Rig {
  std::shared_ptr<hal::Device> dev;
  isa::Image k1 = empty_kernel(1, 0);
  isa::Image k8 = empty_kernel(4, 4);
  isa::Image k9 = empty_kernel(8, 1);
  std::shared_ptr<Runtime> runtime;
  exec::CodeHandle c1, c8, c9;
  MemoryContext* ctx = nullptr;
  hal::StreamId stream{};

  Rig() {
    hal::SimOptions o;
    o.global_memory_bytes = 256ull << 20;
    dev = std::move(hal::create_sim_device(o)).value();
    runtime = std::move(Runtime::create(dev)).value();
    for (auto [image, code] : {std::pair{&k1, &c1}, {&k8, &c8}, {&k9, &c9}}) {
      *code = runtime->registry().register_image(*image).value();
    }
    ctx = &runtime->memory();
    stream = dev->create_stream().value();  // after every upload
  }
  ~Rig() {
    runtime->close();
    dev->destroy_stream(stream).ignore();
  }
};

Rig& rig() {
  static Rig r;
  return r;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// ---- bookkeeping per launch argument -------------------------------------------------

// A device on which every command completes the moment it is issued: launches
// through it cost exactly the memory layer's bookkeeping plus a few virtual calls,
// without the simulator's queueing and the noise of its threads.
class NullDevice final : public npurt::testing::DeviceWithoutPeers {
 public:
  const hal::DeviceInfo& info() const override { return info_; }
  StatusOr<hal::DeviceAddr> allocate(uint64_t bytes, uint64_t) override {
    const hal::DeviceAddr a = next_addr_;
    next_addr_ += (bytes + 4095) & ~uint64_t{4095};
    return a;
  }
  Status free(hal::DeviceAddr) override { return ok_status(); }
  StatusOr<hal::StreamId> create_stream() override { return hal::StreamId(++next_id_); }
  Status destroy_stream(hal::StreamId) override { return ok_status(); }
  Status stream_synchronize(hal::StreamId) override { return ok_status(); }
  StatusOr<bool> stream_query(hal::StreamId) override { return true; }
  StatusOr<hal::EventId> create_event() override { return hal::EventId(++next_id_); }
  Status destroy_event(hal::EventId) override { return ok_status(); }
  Status record_event(hal::StreamId, hal::EventId) override { return ok_status(); }
  Status wait_event(hal::StreamId, hal::EventId) override { return ok_status(); }
  Status event_synchronize(hal::EventId) override { return ok_status(); }
  StatusOr<bool> event_query(hal::EventId) override { return true; }
  Status copy_to_device(hal::StreamId, hal::DeviceAddr, const void*, uint64_t bytes) override {
    counters_.h2d_bytes += bytes;
    return ok_status();
  }
  Status copy_to_host(hal::StreamId, void*, hal::DeviceAddr, uint64_t bytes) override {
    counters_.d2h_bytes += bytes;
    return ok_status();
  }
  Status copy_on_device(hal::StreamId, hal::DeviceAddr, hal::DeviceAddr, uint64_t) override {
    return ok_status();
  }
  Status enqueue_host_function(hal::StreamId, std::function<Status(const Status&)> fn) override {
    return fn(ok_status());
  }
  Status upload_code(hal::DeviceAddr, const isa::Image&) override { return ok_status(); }
  Status launch(hal::StreamId, const hal::LaunchParams& p) override {
    benchmark::DoNotOptimize(p.args.data());
    ++counters_.launches;
    return ok_status();
  }
  Status abort_stream(hal::StreamId) override { return ok_status(); }
  Status reset() override { return ok_status(); }
  hal::Counters counters() const override { return counters_; }

 private:
  hal::DeviceInfo info_{"null", 8, 1ull << 40, 256 << 10, 64, 64, 4};
  hal::DeviceAddr next_addr_{0x1000};
  uint64_t next_id_ = 0;
  hal::Counters counters_;
};

// ns per launch of `code` over `args` through the context, in steady state.
double context_launch_ns(MemoryContext& ctx, hal::StreamId stream, const exec::CodeHandle& code,
                         const std::vector<LaunchArg>& args, int launches) {
  const auto t0 = Clock::now();
  for (int i = 0; i < launches; ++i) {
    if (!ctx.launch(stream, code, 1, args).ok()) std::abort();
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / launches;
}

// The context's launch path (1 and 8 buffer arguments, nothing stale) against its
// peer, the same launch and completion event issued straight to the device. Reports
// the total bookkeeping per argument, (ctx8 - raw) / 8, and the marginal cost of one
// more argument, (ctx8 - ctx1) / 7.
void BM_LaunchBookkeepingPerArgument(benchmark::State& state) {
  const bool tracked = state.range(0) != 0;
  auto null_device = std::make_shared<NullDevice>();
  NullDevice& dev = *null_device;
  auto runtime = Runtime::create(null_device).value();
  MemoryContext* ctx = &runtime->memory();
  const hal::StreamId stream = dev.create_stream().value();
  const exec::CodeHandle k1 = runtime->registry().register_image(empty_kernel(1, 0)).value();
  const exec::CodeHandle k8 = runtime->registry().register_image(empty_kernel(4, 4)).value();
  std::vector<Buffer> buffers;
  std::vector<LaunchArg> args1, args8;
  hal::LaunchParams raw;
  raw.image = k8.address();
  for (int i = 0; i < 8; ++i) {
    BufferOptions o;
    o.name = "arg" + std::to_string(i);
    o.track_writes = tracked;
    buffers.push_back(std::move(ctx->create_buffer(64 << 10, o).value()));
    { auto g = ctx->overwrite(buffers.back().view()).value(); }
    args8.emplace_back(buffers.back().view());
    raw.args.push_back(hal::KernelArg::buffer(buffers.back().device_address(), 64 << 10));
  }
  args1.push_back(args8[0]);
  const hal::EventId event = dev.create_event().value();
  // The first launches upload the inputs; from then on nothing is stale.
  context_launch_ns(*ctx, stream, k8, args8, 1);
  context_launch_ns(*ctx, stream, k1, args1, 1);
  const hal::Counters before = dev.counters();

  constexpr int kLaunches = 256;
  std::vector<double> c1, c8, w;
  for (auto _ : state) {
    c1.push_back(context_launch_ns(*ctx, stream, k1, args1, kLaunches));
    c8.push_back(context_launch_ns(*ctx, stream, k8, args8, kLaunches));
    const auto t0 = Clock::now();
    for (int i = 0; i < kLaunches; ++i) {
      if (!dev.launch(stream, raw).ok() || !dev.record_event(stream, event).ok()) std::abort();
    }
    w.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kLaunches);
    state.SetIterationTime(c8.back() * 1e-9);
  }
  const hal::Counters moved = dev.counters() - before;
  const double m1 = median(c1), m8 = median(c8), mw = median(w);
  state.counters["ctx1_ns_per_launch"] = m1;
  state.counters["ctx8_ns_per_launch"] = m8;
  state.counters["raw_ns_per_launch"] = mw;
  state.counters["ns_per_arg"] = (m8 - mw) / 8;
  state.counters["marginal_ns_per_arg"] = (m8 - m1) / 7;
  state.counters["bytes_moved"] = static_cast<double>(moved.h2d_bytes + moved.d2h_bytes);
  state.counters["events"] = static_cast<double>(ctx->stats().events_created);
  state.SetLabel(tracked ? "tracked buffers" : "untracked buffers");
}
BENCHMARK(BM_LaunchBookkeepingPerArgument)
    ->ArgName("tracked")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(200)
    ->UseManualTime()
    ->Unit(benchmark::kNanosecond);

// The same launch (8 arguments, nothing stale) enqueued on the simulator, through
// the context and straight: the bookkeeping in proportion to a real device's
// enqueue cost.
void BM_SimLaunchEnqueue(benchmark::State& state) {
  Rig& r = rig();
  const bool through_context = state.range(0) != 0;
  std::vector<Buffer> buffers;
  std::vector<LaunchArg> args;
  hal::LaunchParams raw;
  raw.image = r.c8.address();
  for (int i = 0; i < 8; ++i) {
    buffers.push_back(std::move(r.ctx->create_buffer(64 << 10, {.name = "arg"}).value()));
    { auto g = r.ctx->overwrite(buffers.back().view()).value(); }
    args.emplace_back(buffers.back().view());
    raw.args.push_back(hal::KernelArg::buffer(buffers.back().device_address(), 64 << 10));
  }
  const hal::EventId event = r.dev->create_event().value();
  if (!r.ctx->launch(r.stream, r.c8, 1, args).ok() || !r.ctx->synchronize().ok()) {
    std::abort();
  }
  constexpr int kBatch = 64;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      const bool ok = through_context ? r.ctx->launch(r.stream, r.c8, 1, args).ok()
                                      : r.dev->launch(r.stream, raw).ok() &&
                                            r.dev->record_event(r.stream, event).ok();
      if (!ok) std::abort();
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count() / kBatch);
    if (!r.dev->stream_synchronize(r.stream).ok()) std::abort();  // untimed drain
  }
  state.SetLabel(through_context ? "MemoryContext::launch" : "peer: Device::launch + record_event");
  r.dev->destroy_event(event).ignore();
}
BENCHMARK(BM_SimLaunchEnqueue)
    ->ArgName("context")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(300)
    ->UseManualTime()
    ->Unit(benchmark::kNanosecond);

// ---- bytes moved per dispatch ------------------------------------------------------------

enum Rewrite { kAllViews, kOneView, kNothing, kPeerWholeArena };

void BM_BytesPerDispatch(benchmark::State& state) {
  Rig& r = rig();
  const auto scenario = static_cast<Rewrite>(state.range(0));
  constexpr uint64_t kView = 64 << 10;
  constexpr int kViews = 8;
  Buffer arena = std::move(r.ctx->create_buffer(kViews * kView, {.name = "input arena"}).value());
  Buffer out = std::move(r.ctx->create_buffer(kView, {.name = "out"}).value());
  std::vector<View> views;
  std::vector<LaunchArg> args;
  for (int i = 0; i < kViews; ++i) {
    views.push_back(arena.view(i * kView, kView).value());
    args.emplace_back(views.back());
  }
  args.emplace_back(out.view());
  { auto g = r.ctx->overwrite(arena.view()).value(); }
  if (!r.ctx->launch(r.stream, r.c9, 1, args).ok()) std::abort();
  { auto g = r.ctx->read(out.view()).value(); }
  const hal::Counters before = r.dev->counters();

  uint64_t dispatches = 0;
  for (auto _ : state) {
    switch (scenario) {
      case kAllViews:
        for (const View& v : views) {
          auto g = r.ctx->overwrite(v).value();
          std::memset(g.bytes().data(), static_cast<int>(dispatches), 64);
        }
        break;
      case kOneView: {
        auto g = r.ctx->overwrite(views[dispatches % kViews]).value();
        std::memset(g.bytes().data(), static_cast<int>(dispatches), 64);
        break;
      }
      case kNothing: break;
      case kPeerWholeArena:
        if (!r.ctx->mark_host_written(arena.view()).ok()) std::abort();
        break;
    }
    if (!r.ctx->launch(r.stream, r.c9, 1, args).ok()) std::abort();
    auto g = r.ctx->read(out.view()).value();
    benchmark::DoNotOptimize(g.bytes().data());
    ++dispatches;
  }
  const hal::Counters moved = r.dev->counters() - before;
  state.counters["h2d_bytes_per_dispatch"] =
      static_cast<double>(moved.h2d_bytes) / static_cast<double>(dispatches);
  state.counters["d2h_bytes_per_dispatch"] =
      static_cast<double>(moved.d2h_bytes) / static_cast<double>(dispatches);
  static const char* names[] = {"all 8 views rewritten", "one view rewritten", "nothing rewritten",
                                "peer: whole arena re-sent"};
  state.SetLabel(names[scenario]);
}
BENCHMARK(BM_BytesPerDispatch)
    ->ArgName("scenario")
    ->DenseRange(kAllViews, kPeerWholeArena)
    ->Iterations(200)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- which write-tracking mechanism tracked mode uses --------------------------------------

void BM_TrackedModeMechanism(benchmark::State& state) {
  const size_t page = PageWriteTracker::page_size();
  void* mem = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) std::abort();
  std::string label;
  {
    auto tracker = PageWriteTracker::create(mem, page);  // what BufferOptions' kAuto gets
    label = tracker.ok() ? std::string("tracked mode uses ") +
                               write_tracking_mechanism_name(tracker->mechanism())
                         : tracker.status().to_string();
    for (auto _ : state) benchmark::DoNotOptimize(tracker.ok());
  }
  munmap(mem, page);
  const Status uffd = PageWriteTracker::userfaultfd_support();
  if (!uffd.ok()) label += " (userfaultfd unavailable: " + uffd.message() + ")";
  state.SetLabel(label);
}
BENCHMARK(BM_TrackedModeMechanism)->Iterations(1);

}  // namespace
