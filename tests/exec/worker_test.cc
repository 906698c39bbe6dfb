// System tests of the Worker on the simulated NPU, where a stale instruction is
// observable twice: as a wrong number (the cores execute another image's cached
// lines) and, with SimOptions::sanitize, as a kHazard "stale instruction fetch".
//
// The hazard tests run each scenario under the correct policy and under a broken
// one (Hazard::kNaiveStreamReuse or kUnprimedStreams, base/hazards.h) and require the broken
// one to produce a wrong output or a hazard: proof that the scenario can catch it.
#include "exec/exec_factory.h"
#include "npurt/base/hazards.h"
#include "npurt/exec/worker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "hal/sim_test_util.h"

namespace npurt::exec {
namespace {

using hal::KernelArg;
using isa::BinOp;
using namespace npurt::testing;

constexpr size_t kN = 64 * 8;  // one 64-element tile per block, grid 8
constexpr uint64_t kBytes = kN * sizeof(float);

float apply(BinOp op, float a, float b) {
  switch (op) {
    case BinOp::kAdd: return a + b;
    case BinOp::kSub: return a - b;
    case BinOp::kMul: return a * b;
    case BinOp::kMax: return std::max(a, b);
    default: return std::nanf("");
  }
}

// Same-length names and the same code length: every elementwise image has the same
// layout, so an image registered after another one is freed lands at its address.
isa::Image image(const char* name, BinOp op) { return elementwise_kernel(name, op).value(); }

// A simulated device, a registry and a worker, with x, y and out buffers per slot
// (runs on different slots never share a buffer, so they need no ordering).
struct Rig {
  struct SlotBuffers {
    hal::DeviceAddr x{}, y{}, out{};
  };

  explicit Rig(WorkerOptions options = {}, bool sanitize = false) {
    hal::SimOptions so;
    so.sanitize = sanitize;
    dev = make_sim(so);
    registry = std::make_shared<CodeRegistry>(ExecFactory::key(), dev);
    auto w = Worker::make(ExecFactory::key(), registry, options);
    if (!w.ok()) ADD_FAILURE() << w.status().to_string();
    worker = std::move(w).value();
    hx = random_floats(kN, 1);
    hy = random_floats(kN, 2);
    poison.assign(kN, std::nanf(""));
    const hal::StreamId s = dev->create_stream().value();
    for (uint32_t i = 0; i < options.depth; ++i) {
      bufs.push_back({put(*dev, s, hx), put(*dev, s, hy),
                      put(*dev, s, std::vector<float>(kN, 0.f))});
    }
    busy_out = put(*dev, s, std::vector<float>(options.depth, 0.f));
    if (!dev->destroy_stream(s).ok()) ADD_FAILURE() << "destroy setup stream";
    base = dev->counters();
  }

  // out = x <op> y on the run's slot buffers; the output is read back into *result.
  RunHandle submit(const CodeHandle& code, std::vector<float>* result, uint32_t grid = 8) {
    result->assign(kN, 0.f);
    return worker->submit(
        [this, code, result, grid](RunContext& ctx) -> Status {
          const SlotBuffers& b = bufs[ctx.slot()];
          NPURT_RETURN_IF_ERROR(ctx.copy_to_device(b.out, poison.data(), kBytes));
          NPURT_RETURN_IF_ERROR(ctx.launch(code, grid,
                                           {KernelArg::buffer(b.x, kBytes), KernelArg::buffer(b.y, kBytes),
                                            KernelArg::buffer(b.out, kBytes)}));
          return ctx.copy_to_host(result->data(), b.out, kBytes);
        },
        {code});
  }

  // A run of the busy kernel: spins `count` iterations, then writes `value`; with a
  // gate, the run's stream is held before the kernel until the gate opens.
  RunHandle submit_busy(const CodeHandle& busy, int64_t count, float value, float* result,
                        std::optional<StreamGate>* gate = nullptr) {
    return worker->submit(
        [this, busy, count, value, result, gate](RunContext& ctx) -> Status {
          const hal::DeviceAddr out = busy_out + ctx.slot() * sizeof(float);
          if (gate != nullptr) gate->emplace(*dev, ctx.stream());
          NPURT_RETURN_IF_ERROR(ctx.launch(busy, 1,
                                           {KernelArg::scalar_i64(count), KernelArg::scalar_f32(value),
                                            KernelArg::buffer(out, 4)}));
          return ctx.copy_to_host(result, out, sizeof(float));
        },
        {busy});
  }

  bool matches(const std::vector<float>& out, BinOp op) const {
    if (out.size() != kN) return false;
    for (size_t i = 0; i < kN; ++i) {
      if (out[i] != apply(op, hx[i], hy[i])) return false;
    }
    return true;
  }

  CodeHandle reg(const isa::Image& img) {
    auto h = registry->register_image(img);
    if (!h.ok()) ADD_FAILURE() << h.status().to_string();
    return std::move(h).value();
  }

  hal::Counters delta() const { return dev->counters() - base; }

  std::shared_ptr<hal::Device> dev;
  std::shared_ptr<CodeRegistry> registry;
  std::unique_ptr<Worker> worker;
  std::vector<float> hx, hy, poison;
  std::vector<SlotBuffers> bufs;
  hal::DeviceAddr busy_out{};
  hal::Counters base;
};

// ---------------------------------------------------------------------------------
// A -> B -> A across two slots, with address recycling.

struct AbaOutcome {
  Status status[3];
  bool correct[3] = {false, false, false};
  uint64_t hazards = 0;
};

AbaOutcome run_aba(ReusePolicy policy, bool sanitize) {
  WorkerOptions o;
  o.depth = 2;
  const ScopedHazard naive(Hazard::kNaiveStreamReuse, policy == ReusePolicy::kNaiveLastImage);
  Rig rig(o, sanitize);
  AbaOutcome r;
  std::vector<float> out[3];

  // Run 0, slot 0: A. Then A goes away and its block is freed.
  CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  const hal::DeviceAddr addr = a.address();
  r.status[0] = rig.submit(a, &out[0]).wait();
  EXPECT_TRUE(rig.registry->unregister(a).ok());

  // Run 1, slot 1: B, published at A's old address.
  CodeHandle b = rig.reg(image("B", BinOp::kMul));
  EXPECT_EQ(b.address(), addr) << "precondition: B must recycle A's block";
  r.status[1] = rig.submit(b, &out[1]).wait();
  EXPECT_TRUE(rig.registry->unregister(b).ok());

  // Run 2, slot 0 again: A, published again at the same address. The cores cached
  // B's bytes there while slot 0 last ran A.
  CodeHandle a2 = rig.reg(image("A", BinOp::kAdd));
  EXPECT_EQ(a2.address(), addr) << "precondition: A must land at the same address again";
  RunHandle last = rig.submit(a2, &out[2]);
  EXPECT_EQ(last.slot(), 0u);
  r.status[2] = last.wait();

  const BinOp ops[3] = {BinOp::kAdd, BinOp::kMul, BinOp::kAdd};
  for (int i = 0; i < 3; ++i) r.correct[i] = r.status[i].ok() && rig.matches(out[i], ops[i]);
  r.hazards = rig.delta().hazard_stale_fetch;
  return r;
}

TEST(WorkerHazard, AbaAcrossTwoSlotsWithRecycledAddressIsCorrect) {
  for (bool sanitize : {false, true}) {
    SCOPED_TRACE(sanitize ? "sanitizer on" : "sanitizer off");
    const AbaOutcome r = run_aba(ReusePolicy::kPublicationAware, sanitize);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(r.status[i].ok()) << "run " << i << ": " << r.status[i].to_string();
      EXPECT_TRUE(r.correct[i]) << "run " << i << " does not match its own image's reference";
    }
    EXPECT_EQ(r.hazards, 0u);
  }
}

// The same scenario under the naive policy must go wrong: proof the test catches it.
TEST(WorkerHazard, AbaUnderNaiveLastImagePolicyIsCaught) {
  {
    const AbaOutcome r = run_aba(ReusePolicy::kNaiveLastImage, /*sanitize=*/false);
    EXPECT_TRUE(r.correct[0] && r.correct[1]);
    EXPECT_TRUE(r.status[2].ok()) << r.status[2].to_string();
    EXPECT_FALSE(r.correct[2]) << "without the sanitizer the stale code shows as a wrong output";
  }
  {
    const AbaOutcome r = run_aba(ReusePolicy::kNaiveLastImage, /*sanitize=*/true);
    EXPECT_EQ(r.status[2].code(), StatusCode::kHazard) << r.status[2].to_string();
    EXPECT_TRUE(contains(r.status[2], "stale instruction fetch")) << r.status[2].to_string();
    EXPECT_TRUE(contains(r.status[2], "run 2 (slot 0)")) << r.status[2].to_string();
    EXPECT_GE(r.hazards, 1u);
  }
}

// A fresh stream's first launch invalidates only the cores it uses. A run whose first
// launch is one block wide and whose second is eight wide would otherwise execute
// stale lines on cores 1..7; the Worker primes every fresh stream over all cores.
struct PrimeOutcome {
  Status status;
  bool correct = false;
  uint64_t hazards = 0;
};

PrimeOutcome run_narrow_first_launch(bool prime, bool sanitize) {
  WorkerOptions o;
  o.depth = 1;
  const ScopedHazard unprimed(Hazard::kUnprimedStreams, !prime);
  Rig rig(o, sanitize);
  const CodeHandle busy = rig.reg(busy_kernel().value());
  std::vector<float> out;
  CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  EXPECT_TRUE(rig.submit(a, &out).wait().ok());
  const hal::DeviceAddr addr = a.address();
  EXPECT_TRUE(rig.registry->unregister(a).ok());
  CodeHandle b = rig.reg(image("B", BinOp::kMul));
  EXPECT_EQ(b.address(), addr);

  out.assign(kN, 0.f);
  PrimeOutcome r;
  auto narrow_then_wide = [&](RunContext& ctx) -> Status {
    const auto& buf = rig.bufs[0];
    NPURT_RETURN_IF_ERROR(ctx.launch(
        busy, 1, {KernelArg::scalar_i64(0), KernelArg::scalar_f32(1.f), KernelArg::buffer(rig.busy_out, 4)}));
    NPURT_RETURN_IF_ERROR(ctx.launch(b, 8,
                                     {KernelArg::buffer(buf.x, kBytes), KernelArg::buffer(buf.y, kBytes),
                                      KernelArg::buffer(buf.out, kBytes)}));
    return ctx.copy_to_host(out.data(), buf.out, kBytes);
  };
  r.status = rig.worker->submit(narrow_then_wide, {b, busy}).wait();
  r.correct = r.status.ok() && rig.matches(out, BinOp::kMul);
  r.hazards = rig.delta().hazard_stale_fetch;
  return r;
}

TEST(WorkerHazard, FreshStreamsArePrimedOverEveryCore) {
  for (bool sanitize : {false, true}) {
    SCOPED_TRACE(sanitize ? "sanitizer on" : "sanitizer off");
    const PrimeOutcome r = run_narrow_first_launch(/*prime=*/true, sanitize);
    EXPECT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_TRUE(r.correct);
    EXPECT_EQ(r.hazards, 0u);
  }
  // Without priming the same run is caught: proof the scenario can fail.
  const PrimeOutcome wrong = run_narrow_first_launch(/*prime=*/false, /*sanitize=*/false);
  EXPECT_FALSE(wrong.correct);
  const PrimeOutcome hazard = run_narrow_first_launch(/*prime=*/false, /*sanitize=*/true);
  EXPECT_EQ(hazard.status.code(), StatusCode::kHazard) << hazard.status.to_string();
}

// ---------------------------------------------------------------------------------
// Stream churn.

TEST(WorkerStreams, AlternatingResidentImagesCreateNoStreams) {
  for (ReusePolicy policy : {ReusePolicy::kPublicationAware, ReusePolicy::kNaiveLastImage}) {
    SCOPED_TRACE(std::string(reuse_policy_name(policy)));
    const ScopedHazard naive(Hazard::kNaiveStreamReuse, policy == ReusePolicy::kNaiveLastImage);
    Rig rig;
    const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
    const CodeHandle b = rig.reg(image("B", BinOp::kMul));
    const hal::Counters before = rig.dev->counters();
    std::deque<std::vector<float>> outs;
    std::vector<RunHandle> runs;
    // Runs 0,1 use A; 2,3 use B; ...: each slot alternates between the two images.
    for (int i = 0; i < 100; ++i) {
      outs.emplace_back();
      runs.push_back(rig.submit((i / 2) % 2 == 0 ? a : b, &outs.back()));
    }
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(runs[i].wait().ok()) << runs[i].wait().to_string();
      EXPECT_TRUE(rig.matches(outs[i], (i / 2) % 2 == 0 ? BinOp::kAdd : BinOp::kMul)) << "run " << i;
    }
    const WorkerStats s = rig.worker->stats();
    const hal::Counters d = rig.dev->counters() - before;
    if (policy == ReusePolicy::kPublicationAware) {
      EXPECT_EQ(s.streams.streams_created, 2u) << "one per slot, then zero";
      EXPECT_EQ(d.streams_created, 2u);
      EXPECT_EQ(s.streams.stale_replacements, 0u);
      EXPECT_EQ(s.streams.reuse_hits, 98u);
    } else {
      // The naive key rebuilds a stream whenever a slot changes image.
      EXPECT_EQ(s.streams.streams_created, 100u);
      EXPECT_EQ(s.streams.stale_replacements, 98u);
    }
    EXPECT_EQ(s.runs_completed, 100u);
    EXPECT_EQ(d.hazard_stale_fetch, 0u);
  }
}

TEST(WorkerStreams, RegisteringAResidentImageNeitherUploadsNorInvalidates) {
  Rig rig;
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  std::vector<float> out;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(rig.submit(a, &out).wait().ok());
  const hal::Counters before = rig.dev->counters();
  const uint64_t epoch = rig.registry->publication_epoch();
  const WorkerStats s0 = rig.worker->stats();

  const CodeHandle again = rig.reg(image("A", BinOp::kAdd));
  EXPECT_EQ(again, a);
  EXPECT_EQ(rig.registry->publication_epoch(), epoch);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(rig.submit(again, &out).wait().ok());
    EXPECT_TRUE(rig.matches(out, BinOp::kAdd));
  }
  const hal::Counters d = rig.dev->counters() - before;
  const WorkerStats s1 = rig.worker->stats();
  EXPECT_EQ(d.code_uploads, 0u);
  EXPECT_EQ(d.streams_created, 0u);
  EXPECT_EQ(d.streams_destroyed, 0u);
  EXPECT_EQ(d.icache_invalidations, 0u);
  EXPECT_EQ(s1.code.dedup_hits - s0.code.dedup_hits, 1u);
  EXPECT_EQ(s1.code.publications, s0.code.publications);
  EXPECT_EQ(s1.streams.reuse_hits - s0.streams.reuse_hits, 2u);
  EXPECT_EQ(s1.prime_launches, s0.prime_launches);
}

TEST(WorkerStreams, ExactStreamCreationCounts) {
  Rig rig;  // depth 2
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  std::vector<float> out;
  auto created = [&] { return rig.worker->stats().streams.streams_created; };
  auto destroyed = [&] { return rig.worker->stats().streams.streams_destroyed; };
  auto run = [&](const CodeHandle& h) {
    Status st = rig.submit(h, &out).wait();
    EXPECT_TRUE(st.ok()) << st.to_string();
  };

  // First run per slot: one stream each.
  run(a);
  EXPECT_EQ(created(), 1u);
  run(a);
  EXPECT_EQ(created(), 2u);
  EXPECT_EQ(rig.delta().streams_created, 2u);

  // Steady state: none.
  for (int i = 0; i < 10; ++i) run(a);
  EXPECT_EQ(created(), 2u);
  EXPECT_EQ(destroyed(), 0u);

  // One publication: each slot replaces its stream once, at its next run.
  const CodeHandle c = rig.reg(image("C", BinOp::kSub));
  EXPECT_EQ(created(), 2u) << "replacement happens at the slot's next run, not at publication";
  run(a);
  EXPECT_EQ(created(), 3u);
  EXPECT_EQ(destroyed(), 1u);
  run(c);
  EXPECT_TRUE(rig.matches(out, BinOp::kSub));
  EXPECT_EQ(created(), 4u);
  EXPECT_EQ(destroyed(), 2u);
  for (int i = 0; i < 10; ++i) run(i % 2 ? a : c);
  EXPECT_EQ(created(), 4u);
  EXPECT_EQ(destroyed(), 2u);

  const hal::Counters d = rig.delta();
  EXPECT_EQ(d.streams_created, 4u);
  EXPECT_EQ(d.streams_destroyed, 2u);
  EXPECT_EQ(rig.worker->stats().streams.stale_replacements, 2u);
  EXPECT_EQ(rig.worker->stats().prime_launches, 4u) << "one per fresh stream";
}

TEST(WorkerStreams, StreamPerRunCreatesOneStreamPerRun) {
  WorkerOptions o;
  o.stream_per_run = true;
  Rig rig(o);
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  std::vector<float> out;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(rig.submit(a, &out).wait().ok());
    EXPECT_TRUE(rig.matches(out, BinOp::kAdd));
  }
  EXPECT_EQ(rig.delta().streams_created, 6u);
  EXPECT_EQ(rig.delta().streams_destroyed, 6u);
  EXPECT_EQ(rig.worker->stats().streams.reuse_hits, 0u);
}

// ---------------------------------------------------------------------------------
// Code lifetime.

TEST(WorkerCode, UnregisterWhileARunUsesTheImage) {
  Rig rig;
  CodeHandle busy = rig.reg(busy_kernel().value());
  const hal::DeviceAddr addr = busy.address();
  const uint64_t size = busy.bytes();
  float result = 0.f;
  std::optional<StreamGate> gate;
  RunHandle run = rig.submit_busy(busy, 1000, 7.f, &result, &gate);
  NPURT_ASSERT_OK(rig.registry->unregister(busy));
  ASSERT_FALSE(run.done()) << "the run is held in flight";
  EXPECT_EQ(rig.registry->stats().blocks_freed, 0u) << "the in-flight run holds the block";
  EXPECT_EQ(rig.registry->stats().live_images, 2u);  // busy + the priming kernel

  gate->open();
  NPURT_ASSERT_OK(run.wait());
  EXPECT_EQ(result, 7.f);
  EXPECT_EQ(rig.registry->stats().blocks_freed, 1u) << "freed at retirement";
  EXPECT_EQ(rig.registry->stats().live_images, 1u);
  auto again = rig.dev->allocate(size);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, addr) << "the block went back to the allocator";
}

// Runs keep using, and the registry keeps publishing, while another thread registers
// and drops images; the main thread drops each run's image right after submitting
// it. Addresses recycle constantly under runs in flight; with the sanitizer on, any
// stale instruction would fail a run.
TEST(WorkerCode, RegisterAndUnregisterFromAnotherThreadWhileRunsAreInFlight) {
  Rig rig({}, /*sanitize=*/true);
  std::atomic<bool> stop{false};
  std::atomic<int> churn_errors{0}, churned{0};
  std::thread churn([&] {
    const isa::Image imgs[] = {image("F", BinOp::kSub), image("G", BinOp::kMax), image("H", BinOp::kMul)};
    for (int i = 0; !stop.load(); ++i) {
      auto h = rig.registry->register_image(imgs[i % 3]);
      if (!h.ok() || !rig.registry->unregister(*h).ok()) ++churn_errors;
      ++churned;
      // Leave the locks alone for a moment: a tight loop only measures mutex
      // unfairness on small machines.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  const BinOp ops[] = {BinOp::kAdd, BinOp::kSub, BinOp::kMul, BinOp::kMax};
  const isa::Image imgs[] = {image("E", ops[0]), image("E", ops[1]), image("E", ops[2]), image("E", ops[3])};
  // Slot 0 (even runs) always runs E+, slot 1 cycles through the others: A -> B -> A
  // across slots, over and over, at whatever addresses the allocator recycles.
  auto op_of = [](int i) { return i % 2 == 0 ? 0 : 1 + (i / 2) % 3; };
  constexpr int kRuns = 120;
  std::deque<std::vector<float>> outs;
  std::vector<RunHandle> runs;
  for (int i = 0; i < kRuns; ++i) {
    // Register once the slot's previous run retired (submit would wait for it
    // anyway): its image is freed by then, so this one is a real publication.
    if (i >= 2) runs[i - 2].wait().ignore();
    CodeHandle h = rig.reg(imgs[op_of(i)]);
    outs.emplace_back();
    runs.push_back(rig.submit(h, &outs.back()));
    NPURT_ASSERT_OK(rig.registry->unregister(h));  // the run holds it now
  }
  for (int i = 0; i < kRuns; ++i) {
    Status st = runs[i].wait();
    EXPECT_TRUE(st.ok()) << "run " << i << ": " << st.to_string();
    EXPECT_TRUE(rig.matches(outs[i], ops[op_of(i)])) << "run " << i;
  }
  stop = true;
  churn.join();
  EXPECT_EQ(churn_errors.load(), 0);
  EXPECT_GT(churned.load(), 0);
  EXPECT_EQ(rig.delta().hazard_stale_fetch, 0u);
  const WorkerStats s = rig.worker->stats();
  EXPECT_EQ(s.runs_completed, static_cast<uint64_t>(kRuns));
  EXPECT_GT(s.code.publications, 4u);
  EXPECT_EQ(s.code.live_images, 1u) << "only the priming kernel is left";
}

// ---------------------------------------------------------------------------------
// Errors, leases, completion.

TEST(WorkerErrors, CallableErrorSurfacesOnTheRunHandle) {
  Rig rig;
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  RunHandle r = rig.worker->submit([](RunContext&) { return invalid_argument("bad shape 3x5"); }, {a});
  Status st = r.wait();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_TRUE(contains(st, "run 0 (slot 0)")) << st.to_string();
  EXPECT_TRUE(contains(st, "bad shape 3x5")) << st.to_string();
  EXPECT_EQ(rig.worker->stats().runs_failed, 1u);

  // The worker carries on; the failed run's stream was not trusted again.
  std::vector<float> out;
  rig.submit(a, &out).wait().ignore();
  NPURT_ASSERT_OK(rig.submit(a, &out).wait());
  EXPECT_TRUE(rig.matches(out, BinOp::kAdd));
  EXPECT_EQ(rig.worker->stats().streams.unproven_retirements, 1u);
}

TEST(WorkerErrors, KernelFaultFailsTheRunAndTheSlotGetsAFreshStream) {
  Rig rig;
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  const auto& buf = rig.bufs[0];
  RunHandle bad = rig.worker->submit(
      [&](RunContext& ctx) {
        // `out` is half as long as the kernel writes: the device faults the store.
        return ctx.launch(a, 8, {KernelArg::buffer(buf.x, kBytes), KernelArg::buffer(buf.y, kBytes),
                                 KernelArg::buffer(buf.out, kBytes / 2)});
      },
      {a});
  Status st = bad.wait();
  EXPECT_EQ(st.code(), StatusCode::kDeviceFault) << st.to_string();
  EXPECT_TRUE(contains(st, "run 0 (slot 0)")) << st.to_string();
  EXPECT_TRUE(contains(st, "'A'")) << st.to_string();

  const uint64_t created = rig.worker->stats().streams.streams_created;
  std::vector<float> out;
  NPURT_ASSERT_OK(rig.submit(a, &out).wait());  // slot 1
  NPURT_ASSERT_OK(rig.submit(a, &out).wait());  // slot 0: a fresh stream
  EXPECT_TRUE(rig.matches(out, BinOp::kAdd));
  EXPECT_EQ(rig.worker->stats().streams.streams_created, created + 2);
  EXPECT_EQ(rig.worker->stats().runs_failed, 1u);
  EXPECT_EQ(rig.worker->stats().runs_completed, 2u);
}

TEST(WorkerErrors, EmptyHandleAndUnsubmittedCodeAreRefused) {
  Rig rig;
  CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  const CodeHandle b = rig.reg(image("B", BinOp::kMul));
  CodeHandle gone = a;
  NPURT_ASSERT_OK(rig.registry->unregister(gone));
  Status st = rig.worker->submit([](RunContext&) { return ok_status(); }, {gone}).wait();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_TRUE(contains(st, "code handle 0 is empty")) << st.to_string();

  const auto& buf = rig.bufs[1];
  st = rig.worker
           ->submit(
               [&](RunContext& ctx) {
                 return ctx.launch(b, 8, {KernelArg::buffer(buf.x, kBytes), KernelArg::buffer(buf.y, kBytes),
                                          KernelArg::buffer(buf.out, kBytes)});
               },
               {a})
           .wait();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_TRUE(contains(st, "image 'B' is not among the code handles")) << st.to_string();

  st = rig.worker->submit(RunFn(), {a}).wait();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
}

TEST(WorkerErrors, ThrowingCallableIsAnErrorNotACrash) {
  Rig rig;
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  Status st = rig.worker->submit([](RunContext&) -> Status { throw std::runtime_error("boom"); }, {a}).wait();
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_TRUE(contains(st, "boom")) << st.to_string();
}

TEST(WorkerLeases, StaleLeaseIsRejected) {
  Rig rig;  // depth 2
  const CodeHandle a = rig.reg(image("A", BinOp::kAdd));
  const CodeHandle busy = rig.reg(busy_kernel().value());
  std::optional<RunContext> kept;
  NPURT_ASSERT_OK(rig.worker
                      ->submit(
                          [&](RunContext& ctx) {
                            kept = ctx;
                            return ctx.check_lease();
                          },
                          {a})
                      .wait());
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->slot(), 0u);

  // Run 0 retired: its lease no longer owns slot 0.
  const auto& buf = rig.bufs[0];
  Status st = kept->copy_to_device(buf.out, rig.poison.data(), kBytes);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_TRUE(contains(st, "stale lease for stream slot 0")) << st.to_string();
  EXPECT_TRUE(contains(st, "not owned by a run")) << st.to_string();

  std::vector<float> out;
  NPURT_ASSERT_OK(rig.submit(a, &out).wait());  // run 1, slot 1

  // Run 2 owns slot 0 under a newer generation: run 0's lease is still stale.
  Status inside;
  NPURT_ASSERT_OK(rig.worker
                      ->submit(
                          [&](RunContext& ctx) {
                            inside = kept->launch(a, 8, {});
                            return ctx.check_lease();
                          },
                          {a})
                      .wait());
  EXPECT_EQ(inside.code(), StatusCode::kFailedPrecondition) << inside.to_string();
  EXPECT_TRUE(contains(inside, "lease generation 1, slot generation 2")) << inside.to_string();

  // A current lease whose callable has returned may not add work either.
  float result = 0;
  std::optional<RunContext> staged;
  std::optional<StreamGate> gate;
  RunHandle long_run = rig.worker->submit(
      [&](RunContext& ctx) {
        staged = ctx;
        gate.emplace(*rig.dev, ctx.stream());
        return ctx.launch(busy, 1, {KernelArg::scalar_i64(1000), KernelArg::scalar_f32(2.f),
                                    KernelArg::buffer(rig.busy_out, 4)});
      },
      {busy});
  st = staged->copy_to_host(&result, rig.busy_out, 4);
  EXPECT_FALSE(long_run.done());
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
  EXPECT_TRUE(contains(st, "finished staging")) << st.to_string();
  gate->open();
  NPURT_ASSERT_OK(long_run.wait());
  EXPECT_EQ(rig.worker->stats().stale_leases_rejected, 2u);
}

TEST(WorkerCompletion, DoneIsNonBlockingAndRunsRetireInOrder) {
  Rig rig;  // depth 2
  const CodeHandle busy = rig.reg(busy_kernel().value());
  float r0 = 0, r1 = 0;
  std::optional<StreamGate> gate;
  RunHandle slow = rig.submit_busy(busy, 1000, 1.f, &r0, &gate);  // slot 0, held
  bool slow_done_while_staging_next = true;
  RunHandle fast = rig.worker->submit(  // slot 1
      [&](RunContext& ctx) {
        // Run 1 is staged while run 0 still executes.
        slow_done_while_staging_next = slow.done();
        return ctx.launch(busy, 1, {KernelArg::scalar_i64(0), KernelArg::scalar_f32(2.f),
                                    KernelArg::buffer(rig.busy_out + 4, 4)});
      },
      {busy});
  EXPECT_FALSE(slow_done_while_staging_next);

  const auto t0 = std::chrono::steady_clock::now();
  const bool done_now = slow.done();
  const auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(done_now);
  EXPECT_LT(dt, std::chrono::milliseconds(100)) << "done() must not wait for the run";

  // Run 1 can finish on the device while run 0 is held, but retires after run 0.
  gate->open();
  NPURT_ASSERT_OK(fast.wait());
  EXPECT_TRUE(slow.done()) << "runs retire in submission order";
  NPURT_ASSERT_OK(slow.wait());
  EXPECT_EQ(r0, 1.f);
  (void)r1;
}

TEST(WorkerCompletion, WaitForPreviousRunOrdersAcrossSlots) {
  Rig rig;  // depth 2
  const CodeHandle busy = rig.reg(busy_kernel().value());
  // Run 0 (slot 0, held) writes 1 to a cell; run 1 (slot 1) waits for it and reads
  // the cell: it must see 1, not the initial 0. Run 0 stays held a little while, so
  // that a run 1 that did not wait would read the cell before run 0 writes it.
  float seen = -1.f, r0 = 0.f;
  std::optional<StreamGate> gate;
  RunHandle first = rig.submit_busy(busy, 1000, 1.f, &r0, &gate);
  RunHandle second = rig.worker->submit(
      [&](RunContext& ctx) {
        NPURT_RETURN_IF_ERROR(ctx.wait_for_previous_run());
        return ctx.copy_to_host(&seen, rig.busy_out, 4);
      },
      {busy});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  gate->open();
  NPURT_ASSERT_OK(second.wait());
  NPURT_ASSERT_OK(first.wait());
  EXPECT_EQ(seen, 1.f);
}

TEST(WorkerOptionsCheck, BadOptionsAreRejected) {
  auto dev = make_sim();
  auto reg = std::make_shared<CodeRegistry>(ExecFactory::key(), dev);
  WorkerOptions o;
  o.depth = 0;
  auto w = Worker::make(ExecFactory::key(), reg, o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status().to_string();
  auto w2 = Worker::make(ExecFactory::key(), nullptr, {});
  ASSERT_FALSE(w2.ok());
  EXPECT_EQ(w2.status().code(), StatusCode::kInvalidArgument) << w2.status().to_string();
}

}  // namespace
}  // namespace npurt::exec
