// One owner for every device resource: objects made from a Runtime die in any order,
// fail by name once it is closed, and take their streams from one path that
// publishes one priming kernel and replaces streams only after a publication.
#include "npurt/runtime/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "npurt/graph/operator_sequence.h"
#include "npurt/isa/builder.h"
#include "npurt/ops/elementwise.h"
#include "value_or_die.h"

namespace npurt {
namespace {

constexpr uint64_t kN = 512;

graph::OperatorSequence add_sequence(const std::string& name, ops::ElementwiseKind kind = ops::ElementwiseKind::kAdd) {
  auto op = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = kind, .n = kN});
  return graph::OperatorSequence(name, {{op, {"a", "b", "out"}}}, {"a", "b"}, {"out"},
                                 {{"a", kN}, {"b", kN}, {"out", kN}});
}

using npurt::testing::value_or_die;

void fill(graph::CompiledSequence& seq, const std::string& name, float value) {
  View v = value_or_die(seq.get_buffer(name));
  std::fill_n(reinterpret_cast<float*>(v.data()), kN, value);
}

std::shared_ptr<Runtime> small_runtime() {
  return value_or_die(Runtime::create("sim", {.cores = 4, .memory_bytes = 64ull << 20}));
}

bool contains(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// Everything a program holds at once: a runtime, a buffer's view, a compiled sequence,
// a worker with a run still in flight, a code handle and a read guard.
struct Objects {
  std::shared_ptr<Runtime> runtime;
  Buffer buffer;
  View view;
  std::unique_ptr<graph::CompiledSequence> seq;
  std::shared_ptr<exec::Worker> worker;
  exec::CodeHandle code;
  std::optional<ReadGuard> guard;
  exec::RunHandle run;

  Objects() {
    runtime = small_runtime();
    buffer = value_or_die(runtime->memory().create_buffer(4096, {.name = "survivor"}));
    view = buffer.view();
    seq = value_or_die(add_sequence("add").compile(*runtime));
    fill(*seq, "a", 1.f);
    fill(*seq, "b", 2.f);
    worker = value_or_die(runtime->make_worker());
    code = seq->code_handles().front();
    guard.emplace(value_or_die(runtime->memory().read(value_or_die(seq->get_buffer("b")))));
    graph::CompiledSequence* s = seq.get();
    run = worker->submit([s](exec::RunContext& ctx) { return s->enqueue(ctx.stream()); }, s->code_handles());
  }

  // Drops object i (0 .. kCount-1).
  void drop(int i) {
    switch (i) {
      case 0: runtime.reset(); break;
      case 1: view = View(), buffer = Buffer(); break;
      case 2: seq.reset(); break;
      case 3: worker.reset(); break;
      case 4: code.reset(); break;
      case 5: guard.reset(); break;
    }
  }
  static constexpr int kCount = 6;
};

// Once the last object is gone, the device (kept by the test alone) holds nothing
// they made: every stream, event and allocation they took was given back.
void expect_nothing_left(const hal::Device& device, const std::string& order) {
  const hal::Counters c = device.counters();
  EXPECT_GT(c.streams_created, 0u) << order;
  EXPECT_EQ(c.streams_destroyed, c.streams_created) << order;
  EXPECT_EQ(c.events_destroyed, c.events_created) << order;
  EXPECT_EQ(c.frees, c.allocations) << order;
  EXPECT_EQ(c.freed_bytes, c.allocated_bytes) << order;
}

std::string order_name(const std::array<int, Objects::kCount>& order) {
  std::string s = "order";
  for (int i : order) s += " " + std::to_string(i);
  return s;
}

TEST(Runtime, ObjectsMayBeDestroyedInEveryOrder) {
  std::array<int, Objects::kCount> order;
  std::iota(order.begin(), order.end(), 0);
  int orders = 0;
  do {
    std::shared_ptr<hal::Device> device;
    {
      Objects o;
      device = o.runtime->shared_device();
      for (int i : order) o.drop(i);
    }
    expect_nothing_left(*device, order_name(order));
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 720);
}

TEST(Runtime, ObjectsMayBeDestroyedInEveryOrderAfterClose) {
  std::array<int, Objects::kCount> order;
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    std::shared_ptr<hal::Device> device;
    {
      Objects o;
      device = o.runtime->shared_device();
      o.runtime->close();
      for (int i : order) o.drop(i);
    }
    expect_nothing_left(*device, order_name(order));
  }
}

TEST(Runtime, TheRunInFlightFinishesWhenItsOwnersGo) {
  Objects o;
  exec::RunHandle run = o.run;
  o.runtime.reset();
  o.worker.reset();  // the worker's close waits for the run
  EXPECT_TRUE(run.done());
  EXPECT_TRUE(run.wait().ok()) << run.wait().to_string();
}

TEST(Runtime, EveryObjectFailsByNameAfterClose) {
  Objects o;
  ASSERT_TRUE(o.run.wait().ok()) << o.run.wait().to_string();
  o.guard.reset();
  o.runtime->close();
  EXPECT_TRUE(o.runtime->closed());

  Status call = o.seq->call();
  EXPECT_EQ(call.code(), StatusCode::kFailedPrecondition) << call.to_string();
  EXPECT_TRUE(contains(call, "sequence 'add'") && contains(call, "closed")) << call.to_string();

  Status run = o.worker->submit([](exec::RunContext&) { return ok_status(); }, {}).wait();
  EXPECT_EQ(run.code(), StatusCode::kFailedPrecondition) << run.to_string();
  EXPECT_TRUE(contains(run, "worker") && contains(run, "is closed")) << run.to_string();

  Status read = o.runtime->memory().read(o.view).status();
  EXPECT_EQ(read.code(), StatusCode::kFailedPrecondition) << read.to_string();
  EXPECT_TRUE(contains(read, "memory context is closed")) << read.to_string();

  isa::KernelBuilder b("late");
  b.exit();
  Status registered = o.runtime->registry().register_image(value_or_die(b.build())).status();
  EXPECT_TRUE(contains(registered, "register_image 'late': the code registry is closed")) << registered.to_string();

  Status worker = o.runtime->make_worker().status();
  EXPECT_TRUE(contains(worker, "make_worker: its runtime is closed")) << worker.to_string();
  Status compiled = add_sequence("late").compile(*o.runtime).status();
  EXPECT_TRUE(contains(compiled, "compiling sequence 'late': its runtime is closed")) << compiled.to_string();
}

// close() while other threads use every kind of object: each call either finishes
// (with the right bytes) or fails by name; nothing crashes, hangs or races (the TSan and
// ASan suites run this too), and the device gets back every stream, event and byte.
TEST(Runtime, CloseMayRaceWithCallsOnEveryObject) {
  int checked = 0;  // sequence calls that finished before close() and were checked
  for (int round = 0; round < 12; ++round) {
    std::shared_ptr<Runtime> rt = small_runtime();
    std::shared_ptr<hal::Device> device = rt->shared_device();
    std::unique_ptr<graph::CompiledSequence> seq = value_or_die(add_sequence("add").compile(*rt));
    std::shared_ptr<exec::Worker> worker = value_or_die(rt->make_worker());
    Buffer buffer = value_or_die(rt->memory().create_buffer(kN * sizeof(float)));
    std::atomic<bool> stop{false};
    std::atomic<int> wrong{0}, done{0};
    std::mutex mu;
    std::string first_wrong;
    auto note_wrong = [&](const std::string& what) {
      std::lock_guard<std::mutex> lock(mu);
      if (wrong++ == 0) first_wrong = what;
    };
    auto failed_by_name = [&](const Status& s) {
      if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) {
        note_wrong(s.to_string());
      }
    };
    std::vector<std::thread> users;
    users.emplace_back([&] {  // a sequence's calls, checked
      for (int i = 0; !stop; ++i) {
        fill(*seq, "a", float(i));
        fill(*seq, "b", 1.0f);
        const Status s = seq->call();
        failed_by_name(s);
        if (!s.ok()) continue;
        auto g = rt->memory().read(value_or_die(seq->get_buffer("out")));
        if (!g.ok()) {
          failed_by_name(g.status());
          continue;
        }
        if (g->as<float>()[kN - 1] != float(i) + 1.0f) note_wrong("call " + std::to_string(i) + ": wrong sum");
        ++done;
      }
    });
    users.emplace_back([&] {  // host access to a buffer
      for (int i = 0; !stop; ++i) {
        {
          auto w = rt->memory().overwrite(buffer.view());
          failed_by_name(w.status());
          if (w.ok()) std::fill_n(w->as<float>().data(), kN, float(i));
        }
        failed_by_name(rt->memory().to_device(buffer.view()));
        failed_by_name(rt->memory().read(buffer.view()).status());
      }
    });
    users.emplace_back([&] {  // a worker's runs and new code
      for (int i = 0; !stop; ++i) {
        failed_by_name(worker->submit([](exec::RunContext&) { return ok_status(); }, {}).wait());
        isa::KernelBuilder b("k" + std::to_string(i % 4));
        b.exit();
        failed_by_name(rt->registry().register_image(value_or_die(b.build())).status());
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(2 + round));
    rt->close();
    stop = true;
    for (std::thread& t : users) t.join();
    EXPECT_EQ(wrong.load(), 0) << "round " << round << ": " << first_wrong;
    checked += done.load();
    seq.reset();
    worker.reset();
    buffer = Buffer();
    rt.reset();
    const hal::Counters c = device->counters();
    EXPECT_EQ(c.streams_created, c.streams_destroyed) << "round " << round;
    EXPECT_EQ(c.events_created, c.events_destroyed) << "round " << round;
    EXPECT_EQ(c.allocations, c.frees) << "round " << round;
  }
  EXPECT_GT(checked, 0) << "close() came before any call finished: the race was not exercised";
}

// A sequence, a second sequence and a worker on one runtime: the priming kernel is
// one image, so it is published once; the sequence's stream is reused call after
// call and replaced (fresh, primed) only after code was published.
TEST(Runtime, OnePrimingKernelAndStreamsReplacedOnlyAfterAPublication) {
  std::shared_ptr<Runtime> rt = small_runtime();
  auto seq = value_or_die(add_sequence("add").compile(*rt));
  fill(*seq, "a", 1.f);
  fill(*seq, "b", 2.f);
  const uint64_t kernels = seq->code_handles().size();
  EXPECT_EQ(rt->registry().stats().publications, kernels + 1) << "the sequence's kernels and one prime";
  auto worker = value_or_die(rt->make_worker());
  EXPECT_EQ(rt->registry().stats().publications, kernels + 1) << "the worker found the prime resident";

  const hal::Counters c0 = rt->device().counters();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(seq->call().ok());
  const hal::Counters c1 = rt->device().counters() - c0;
  EXPECT_EQ(c1.streams_created, 2u) << "the sequence's stream, reused by the later calls, and the memory "
                                       "context's transfer stream";
  EXPECT_EQ(c1.launches, 3u + 1u) << "three calls and one priming launch";

  auto other = value_or_die(add_sequence("mul", ops::ElementwiseKind::kMul).compile(*rt));  // a publication
  EXPECT_EQ(rt->registry().stats().publications, kernels + 2);
  const hal::Counters c2 = rt->device().counters();
  ASSERT_TRUE(seq->call().ok());
  ASSERT_TRUE(seq->call().ok());
  const hal::Counters c3 = rt->device().counters() - c2;
  EXPECT_EQ(c3.streams_created, 1u) << "the sequence's stale stream is replaced once; the transfer stream "
                                       "runs no code and stays";
  EXPECT_EQ(c3.launches, 2u + 1u);

  // The worker's streams follow the same rule: the first run gets a fresh, primed one.
  const hal::Counters c4 = rt->device().counters();
  graph::CompiledSequence* s = seq.get();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(worker->submit([s](exec::RunContext& ctx) { return s->enqueue(ctx.stream()); }, s->code_handles())
                    .wait()
                    .ok());
  }
  const hal::Counters c5 = rt->device().counters() - c4;
  EXPECT_EQ(c5.streams_created, 2u) << "one per slot (depth 2)";
  EXPECT_EQ(worker->stats().prime_launches, 2u);
  View out = value_or_die(seq->get_buffer("out"));
  ReadGuard g = value_or_die(rt->memory().read(out));
  for (float v : g.as<float>()) ASSERT_EQ(v, 3.f);
}

}  // namespace
}  // namespace npurt
