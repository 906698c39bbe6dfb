// EngineLoop: requests submitted from many threads at once, some cancelled, get what
// each gets from a BatchEngine alone; a full queue refuses by name; destruction ends
// what still runs. On the synthetic model, so the sanitizer suites run it too.
#include "serve/engine_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "models/gemma3_rig.h"

namespace npurt::serve {
namespace {

using namespace std::chrono_literals;
using models::EngineRequest;

std::shared_ptr<models::Gemma3Model> load(const models::GgufFile& file, uint32_t sequences) {
  std::shared_ptr<Runtime> runtime = Runtime::create("sim", {.memory_bytes = 256ull << 20}).value();
  return std::shared_ptr<models::Gemma3Model>(
      models::Gemma3Model::load(file, *runtime,
                                {.max_context = 0, .prefill_chunk = 4, .verify_tokens = 0, .batch_sequences = sequences,
                                 .kv_block_positions = 4})
          .value());
}

EngineRequest request(int i) {
  EngineRequest r{.prompt = models::random_prompt(3 + i % 9, 100 + i), .max_tokens = 4 + i % 5};
  if (i % 3 == 1) r.sampling = {.temperature = 0.9f, .seed = static_cast<uint64_t>(i)};
  return r;
}

// The tokens of a stream until its end, and the end event.
struct Drained {
  std::vector<int32_t> tokens;
  StreamEvent end;
  bool ended = false;
};

Drained drain(RequestStream& s) {
  Drained d;
  while (auto e = s.next(10s)) {
    if (e->end) {
      d.end = std::move(*e);
      d.ended = true;
      break;
    }
    d.tokens.push_back(e->token);
  }
  return d;
}

TEST(EngineLoop, RequestsFromManyThreadsGetWhatEachGetsAlone) {
  models::Parsed p = models::parse(models::synthetic_gemma3(models::typed_model()));
  constexpr int kRequests = 24;
  // Alone: one BatchEngine, one request at a time.
  std::vector<std::vector<int32_t>> alone(kRequests);
  {
    auto engine = models::BatchEngine::create(load(p.file, 4)).value();
    for (int i = 0; i < kRequests; ++i) {
      const auto id = engine->submit(request(i)).value();
      ASSERT_TRUE(engine->run_until_idle().ok());
      alone[i] = engine->output(id).value();
    }
  }
  auto loop = EngineLoop::start(load(p.file, 4), nullptr, {.max_queue = kRequests}).value();
  std::vector<Drained> got(kRequests);
  std::vector<std::thread> clients;
  for (int c = 0; c < 6; ++c) {
    clients.emplace_back([&, c] {
      for (int i = c; i < kRequests; i += 6) {
        auto s = loop->submit(request(i));
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        if (i % 8 == 7) loop->cancel(*s);  // cancelled at once: ends, by the loop's word
        got[i] = drain(**s);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(got[i].ended) << "request " << i;
    if (i % 8 == 7) {
      // Cancelled: an end with kAborted, or (if it finished first) its whole output.
      if (!got[i].end.error.ok()) {
        EXPECT_EQ(got[i].end.error.code(), StatusCode::kAborted);
        continue;
      }
    }
    EXPECT_TRUE(got[i].end.error.ok()) << got[i].end.error.to_string();
    EXPECT_EQ(got[i].tokens, alone[i]) << "request " << i;
  }
  // Idle again: every block free.
  for (int i = 0; i < 100 && loop->figures().running + loop->figures().queued > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(loop->figures().kv_blocks_used, 0u);
}

TEST(EngineLoop, AFullQueueAndBadRequestsAreRefusedByNameAndDestructionEndsStreams) {
  models::Parsed p = models::parse(models::synthetic_gemma3(models::typed_model()));
  auto loop = EngineLoop::start(load(p.file, 1), nullptr, {.max_queue = 2}).value();
  EXPECT_EQ(loop->submit({.prompt = {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loop->submit({.prompt = {1}, .stop_strings = {"x"}}).status().code(), StatusCode::kInvalidArgument);
  // Requests back to back, each a submission (microseconds) where the loop needs at
  // least a step (milliseconds) to finish one: the queue fills within a few, however
  // fast the host decodes (pausing between them let a fast host drain the queue).
  std::vector<std::shared_ptr<RequestStream>> streams;
  Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    auto s = loop->submit({.prompt = {1, 2, 3}, .max_tokens = 100});
    if (s.ok()) {
      streams.push_back(*s);
    } else {
      refused = s.status();
    }
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("queue"), std::string::npos) << refused.to_string();
  // Room again once one is cancelled; submitted right before the loop goes, perhaps
  // never taken by its thread: its stream ends too.
  loop->cancel(streams.back());
  for (int i = 0; i < 200; ++i) {
    auto s = loop->submit({.prompt = {4, 5}, .max_tokens = 100});
    if (s.ok()) {
      streams.push_back(*s);
      break;
    }
    std::this_thread::sleep_for(5ms);
  }
  loop.reset();  // ends every stream
  for (const auto& s : streams) {
    const Drained d = drain(*s);
    ASSERT_TRUE(d.ended);
    if (!d.end.error.ok()) {
      EXPECT_EQ(d.end.error.code(), StatusCode::kAborted);
    }
  }
}

}  // namespace
}  // namespace npurt::serve
