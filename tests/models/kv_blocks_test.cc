// KvBlocks: block tables, prefix sharing, copies before writes, the window, running
// out; and a simulated pool whose every row holds a hash of the tokens up to its
// position, written through the plans, against which every table must read its own
// sequence after thousands of random calls.
#include "npurt/models/kv_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "npurt/base/hazards.h"

namespace npurt::models {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t from = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = from + i;
  return t;
}

std::vector<uint32_t> table_of(const KvBlocks& kv, KvBlocks::SequenceId id) {
  const auto t = kv.table(id);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::vector<uint32_t>(t->begin(), t->end()) : std::vector<uint32_t>{};
}

TEST(KvBlocks, BadOptionsAndCallsAreNamed) {
  const auto no_blocks = KvBlocks::create({.blocks = 0});
  ASSERT_FALSE(no_blocks.ok());
  EXPECT_NE(no_blocks.status().message().find("blocks is 0"), std::string::npos) << no_blocks.status().to_string();
  const auto no_positions = KvBlocks::create({.blocks = 4, .block_positions = 0});
  ASSERT_FALSE(no_positions.ok());
  EXPECT_NE(no_positions.status().message().find("block_positions"), std::string::npos);
  EXPECT_FALSE(KvBlocks::create({.blocks = 1u << 20, .block_positions = 1u << 13}).ok());

  KvBlocks kv = *KvBlocks::create({.blocks = 4, .block_positions = 4});
  EXPECT_NE(kv.add(1, {}).status().message().find("prompt is empty"), std::string::npos);
  ASSERT_TRUE(kv.add(1, iota_tokens(3)).ok());
  EXPECT_NE(kv.add(1, iota_tokens(3)).status().message().find("sequence 1 already exists"), std::string::npos);
  EXPECT_EQ(kv.append(7, iota_tokens(1)).status().code(), StatusCode::kNotFound);
  EXPECT_NE(kv.append(7, iota_tokens(1)).status().message().find("sequence 7"), std::string::npos);
  EXPECT_NE(kv.fork(1, 1).message().find("already exists"), std::string::npos);
  EXPECT_EQ(kv.truncate(1, 1).code(), StatusCode::kOutOfRange);  // it has 0 positions
  EXPECT_EQ(kv.remove(9).code(), StatusCode::kNotFound);
  EXPECT_EQ(kv.held_blocks(), 0u);  // nothing above took a block
}

TEST(KvBlocks, PositionsMapToRowsOfTheirBlocks) {
  KvBlocks kv = *KvBlocks::create({.blocks = 8, .block_positions = 4});
  ASSERT_EQ(*kv.add(1, iota_tokens(10)), 0u);
  const AppendPlan plan = *kv.append(1, iota_tokens(10));
  EXPECT_TRUE(plan.copies.empty());
  const std::vector<uint32_t> table = table_of(kv, 1);
  ASSERT_EQ(table.size(), 3u);
  ASSERT_EQ(plan.rows.size(), 10u);
  for (uint32_t p = 0; p < 10; ++p) EXPECT_EQ(plan.rows[p], table[p / 4] * 4 + p % 4) << "position " << p;
  EXPECT_EQ(std::set<uint32_t>(table.begin(), table.end()).size(), 3u);
  EXPECT_EQ(kv.held_blocks(), 3u);
  EXPECT_EQ(*kv.length(1), 10u);
  // Two more tokens fill the third block; the next one takes a fourth.
  const AppendPlan more = *kv.append(1, iota_tokens(3, 200));
  ASSERT_EQ(table_of(kv, 1).size(), 4u);
  EXPECT_EQ(more.rows, (std::vector<uint32_t>{table[2] * 4 + 2, table[2] * 4 + 3, table_of(kv, 1)[3] * 4}));
  EXPECT_EQ(kv.held_blocks(), 4u);
}

TEST(KvBlocks, ACachedPromptPrefixIsSharedInsteadOfComputed) {
  KvBlocks kv = *KvBlocks::create({.blocks = 16, .block_positions = 4});
  const std::vector<int32_t> prompt = iota_tokens(10);
  ASSERT_EQ(*kv.add(1, prompt), 0u);  // nothing cached yet
  ASSERT_TRUE(kv.append(1, prompt).ok());
  const std::vector<uint32_t> first = table_of(kv, 1);

  // The same prompt: its two full blocks are taken, the third (the last token's) is run.
  ASSERT_EQ(*kv.add(2, prompt), 8u);
  std::vector<uint32_t> second = table_of(kv, 2);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0], first[0]);
  EXPECT_EQ(second[1], first[1]);
  EXPECT_EQ(kv.held_blocks(), 3u);
  const AppendPlan rest = *kv.append(2, std::span(prompt).subspan(8));
  EXPECT_TRUE(rest.copies.empty());
  EXPECT_NE(table_of(kv, 2)[2], first[2]);

  // A prompt that differs at token 5 shares the first block only.
  std::vector<int32_t> other = prompt;
  other[5] = 7;
  EXPECT_EQ(*kv.add(3, other), 4u);
  // A prompt of exactly two blocks: the second holds its last token, so it is run.
  EXPECT_EQ(*kv.add(4, iota_tokens(8)), 4u);
  // The same tokens at other positions are not the same block.
  EXPECT_EQ(*kv.add(5, iota_tokens(10, 104)), 0u);

  // Once no sequence holds them, the blocks stay findable until needed.
  for (KvBlocks::SequenceId id : {1, 2, 3, 4, 5}) ASSERT_TRUE(kv.remove(id).ok());
  EXPECT_EQ(kv.held_blocks(), 0u);
  EXPECT_EQ(kv.cached_blocks(), 2u);  // the full blocks of `prompt`
  EXPECT_EQ(*kv.add(6, prompt), 8u);
}

// A block holding a generated token is found by no prompt, even one with the same
// tokens: the prompt's own computation of them may differ in the last bits.
TEST(KvBlocks, BlocksHoldingGeneratedTokensAreNotShared) {
  KvBlocks kv = *KvBlocks::create({.blocks = 16, .block_positions = 4});
  const std::vector<int32_t> prompt = iota_tokens(6), out{50, 51, 52, 53, 54};
  ASSERT_EQ(*kv.add(1, prompt), 0u);
  ASSERT_TRUE(kv.append(1, prompt).ok());
  for (int32_t t : out) ASSERT_TRUE(kv.append(1, std::span(&t, 1), TokenOrigin::kGenerated).ok());
  // Positions 0 .. 3 are prompt alone; 4 .. 7 and 8 .. 10 hold generated tokens.
  std::vector<int32_t> both = prompt;
  both.insert(both.end(), out.begin(), out.end());
  both.push_back(99);
  EXPECT_EQ(*kv.add(2, both), 4u);
  // Rewound to the prompt and run again as prompt, its second block is findable.
  ASSERT_TRUE(kv.truncate(1, 6).ok());
  ASSERT_TRUE(kv.append(1, std::span(out).first(2)).ok());
  EXPECT_EQ(*kv.add(3, both), 8u);
}

TEST(KvBlocks, RunningOutFailsByNameAndChangesNothing) {
  KvBlocks kv = *KvBlocks::create({.blocks = 3, .block_positions = 4});
  ASSERT_TRUE(kv.add(1, iota_tokens(12)).ok());
  ASSERT_TRUE(kv.append(1, iota_tokens(12)).ok());
  ASSERT_TRUE(kv.add(2, iota_tokens(1, 500)).ok());
  const auto full = kv.append(2, iota_tokens(1, 500));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("sequence 2 needs 1 more blocks"), std::string::npos)
      << full.status().to_string();
  EXPECT_EQ(*kv.length(2), 0u);
  EXPECT_TRUE(table_of(kv, 2).empty());
  EXPECT_EQ(kv.held_blocks(), 3u);
  // Preempting sequence 1 frees its blocks (cached: all three are full), and the
  // least recently released one is reused first.
  const std::vector<uint32_t> released = table_of(kv, 1);
  ASSERT_TRUE(kv.remove(1).ok());
  EXPECT_EQ(kv.cached_blocks(), 3u);
  const AppendPlan plan = *kv.append(2, iota_tokens(1, 500));
  EXPECT_EQ(table_of(kv, 2)[0], released[0]);
  EXPECT_EQ(plan.rows[0], released[0] * 4);
  EXPECT_EQ(kv.cached_blocks(), 2u);
  // The reused block is no longer findable: a prompt that matched it starts from 0.
  EXPECT_EQ(*kv.add(3, iota_tokens(12)), 0u);
}

TEST(KvBlocks, AForkCopiesTheBlockItWritesInto) {
  KvBlocks kv = *KvBlocks::create({.blocks = 8, .block_positions = 4});
  ASSERT_TRUE(kv.add(1, iota_tokens(6)).ok());
  ASSERT_TRUE(kv.append(1, iota_tokens(6)).ok());
  ASSERT_TRUE(kv.fork(1, 2).ok());
  const std::vector<uint32_t> parent = table_of(kv, 1);
  EXPECT_EQ(table_of(kv, 2), parent);
  EXPECT_EQ(kv.held_blocks(), 2u);

  const AppendPlan child = *kv.append(2, iota_tokens(1, 900));
  ASSERT_EQ(child.copies.size(), 1u);
  EXPECT_EQ(child.copies[0].from, parent[1]);
  const std::vector<uint32_t> forked = table_of(kv, 2);
  EXPECT_EQ(child.copies[0].to, forked[1]);
  EXPECT_EQ(forked[0], parent[0]);  // full and never written again: still shared
  EXPECT_NE(forked[1], parent[1]);
  EXPECT_EQ(table_of(kv, 1), parent);
  // The parent now holds its second block alone and writes in place.
  EXPECT_TRUE(kv.append(1, iota_tokens(1, 901))->copies.empty());
  EXPECT_EQ(table_of(kv, 1), parent);
}

TEST(KvBlocks, TheWindowKeepsOnlyTheBlocksLaterQueriesReach) {
  constexpr uint32_t kB = 4, kWindow = 6;
  KvBlocks kv = *KvBlocks::create({.blocks = 8, .block_positions = kB, .window = kWindow});
  ASSERT_TRUE(kv.add(1, iota_tokens(1)).ok());
  for (uint32_t n = 0; n < 40; ++n) {
    ASSERT_TRUE(kv.append(1, iota_tokens(1, static_cast<int32_t>(n))).ok()) << "token " << n;
    // The query at n reads positions n - 5 .. n; blocks wholly before n - 5 go.
    const std::vector<uint32_t> t = table_of(kv, 1);
    for (uint32_t j = 0; j < t.size(); ++j) {
      const bool reachable = (j + 1) * kB > (n + 1 > kWindow ? n + 1 - kWindow : 0);
      EXPECT_EQ(t[j] != KvBlocks::kNoBlock, reachable) << "block " << j << " after token " << n;
    }
    EXPECT_LE(kv.held_blocks(), 3u);
  }
  EXPECT_EQ(kv.truncate(1, 20).code(), StatusCode::kFailedPrecondition);  // needs 15 on: released
  EXPECT_TRUE(kv.truncate(1, 37).ok());                                    // needs 32 on: held
}

// Random calls against a simulated pool: row r holds a hash of the tokens up to the
// position written there (what a KV row depends on), written through each plan
// (copies first). Returns how many positions read another sequence's rows.
struct Simulation {
  KvBlocks kv;
  std::vector<uint64_t> pool;
  struct Seq {
    std::vector<int32_t> tokens;
    std::vector<uint64_t> hashes;  // of tokens[0 .. p]
  };
  std::map<KvBlocks::SequenceId, Seq> seqs;

  static uint64_t next_hash(uint64_t h, int32_t t) { return (h ^ static_cast<uint64_t>(t + 1)) * 0x100000001b3ull + 7; }

  void apply(const AppendPlan& plan, Seq& s, std::span<const int32_t> tokens) {
    const uint32_t bp = kv.block_positions();
    for (const BlockCopy& c : plan.copies) {
      std::copy_n(pool.begin() + c.from * bp, bp, pool.begin() + c.to * bp);
    }
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint64_t h = next_hash(s.hashes.empty() ? 0 : s.hashes.back(), tokens[i]);
      s.tokens.push_back(tokens[i]);
      s.hashes.push_back(h);
      pool[plan.rows[i]] = h;
    }
  }

  // Positions whose row holds something else, over every sequence.
  int wrong_reads(uint32_t window) {
    int wrong = 0;
    const uint32_t bp = kv.block_positions();
    for (auto& [id, s] : seqs) {
      const std::vector<uint32_t> t = table_of(kv, id);
      EXPECT_EQ(*kv.length(id), s.tokens.size());
      for (size_t p = 0; p < s.tokens.size(); ++p) {
        const uint32_t b = t[p / bp];
        if (b == KvBlocks::kNoBlock) {
          EXPECT_GT(window, 0u);
          EXPECT_LT(p + window, s.tokens.size() + 1) << "a position in the window was released";
          continue;
        }
        if (pool[b * bp + p % bp] != s.hashes[p]) ++wrong;
      }
    }
    return wrong;
  }

  // Every held block is in some table, and no table names a block twice.
  void check_counts() {
    std::set<uint32_t> held;
    for (auto& [id, s] : seqs) {
      std::set<uint32_t> own;
      for (uint32_t b : table_of(kv, id)) {
        if (b == KvBlocks::kNoBlock) continue;
        EXPECT_TRUE(own.insert(b).second) << "sequence " << id << " names block " << b << " twice";
        held.insert(b);
      }
    }
    EXPECT_EQ(held.size(), kv.held_blocks());
    EXPECT_LE(kv.cached_blocks(), kv.free_blocks());
  }
};

int run_random_calls(const KvBlocksOptions& o, uint32_t seed, int calls) {
  Simulation sim{*KvBlocks::create(o), std::vector<uint64_t>(size_t{o.blocks} * o.block_positions, 0), {}};
  std::mt19937 rng(seed);
  const auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  // A few shared prompt stems, so prefixes repeat; a 3-token alphabet after them.
  const std::vector<std::vector<int32_t>> stems = {iota_tokens(9), iota_tokens(13, 300), iota_tokens(4, 700)};
  KvBlocks::SequenceId next_id = 1;
  int wrong = 0;
  for (int call = 0; call < calls; ++call) {
    const uint32_t what = pick(10);
    if (sim.seqs.empty() || (what < 2 && sim.seqs.size() < 8)) {  // a new sequence
      std::vector<int32_t> prompt = stems[pick(3)];
      for (uint32_t n = pick(8); n > 0; --n) prompt.push_back(static_cast<int32_t>(pick(3)));
      const KvBlocks::SequenceId id = next_id++;
      const uint32_t shared = *sim.kv.add(id, prompt);
      Simulation::Seq s;
      for (uint32_t p = 0; p < shared; ++p) {
        s.tokens.push_back(prompt[p]);
        s.hashes.push_back(Simulation::next_hash(p == 0 ? 0 : s.hashes.back(), prompt[p]));
      }
      sim.seqs[id] = s;
      const std::span<const int32_t> rest = std::span(prompt).subspan(shared);
      const StatusOr<AppendPlan> plan = sim.kv.append(id, rest);
      if (plan.ok()) {
        sim.apply(*plan, sim.seqs[id], rest);
      } else {
        EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
        EXPECT_TRUE(sim.kv.remove(id).ok());
        sim.seqs.erase(id);
      }
    } else {
      auto it = sim.seqs.begin();
      std::advance(it, pick(static_cast<uint32_t>(sim.seqs.size())));
      const KvBlocks::SequenceId id = it->first;
      Simulation::Seq& s = it->second;
      if (what < 7) {  // append
        std::vector<int32_t> tokens;
        for (uint32_t n = 1 + pick(6); n > 0; --n) tokens.push_back(static_cast<int32_t>(pick(3)));
        const uint32_t held = sim.kv.held_blocks();
        const std::vector<uint32_t> before = table_of(sim.kv, id);
        const StatusOr<AppendPlan> plan = sim.kv.append(id, tokens);
        if (plan.ok()) {
          sim.apply(*plan, s, tokens);
        } else {  // nothing changed; preempt this sequence
          EXPECT_EQ(plan.status().code(), StatusCode::kResourceExhausted);
          EXPECT_EQ(sim.kv.held_blocks(), held);
          EXPECT_EQ(table_of(sim.kv, id), before);
          EXPECT_TRUE(sim.kv.remove(id).ok());
          sim.seqs.erase(it);
        }
      } else if (what == 7 && sim.seqs.size() < 8) {  // fork
        const KvBlocks::SequenceId child = next_id++;
        EXPECT_TRUE(sim.kv.fork(id, child).ok());
        sim.seqs[child] = s;
      } else if (what == 8 && !s.tokens.empty()) {  // truncate
        const uint32_t length = pick(static_cast<uint32_t>(s.tokens.size()) + 1);
        const Status st = sim.kv.truncate(id, length);
        if (st.ok()) {
          s.tokens.resize(length);
          s.hashes.resize(length);
        } else {
          EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.to_string();
        }
      } else {  // remove
        EXPECT_TRUE(sim.kv.remove(id).ok());
        sim.seqs.erase(it);
      }
    }
    wrong += sim.wrong_reads(o.window);
    sim.check_counts();
  }
  return wrong;
}

TEST(KvBlocks, EveryTableReadsItsOwnSequenceAfterRandomCalls) {
  for (const KvBlocksOptions& o : {KvBlocksOptions{.blocks = 24, .block_positions = 4},
                                   KvBlocksOptions{.blocks = 10, .block_positions = 3},
                                   KvBlocksOptions{.blocks = 40, .block_positions = 1},
                                   KvBlocksOptions{.blocks = 16, .block_positions = 4, .window = 7}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      EXPECT_EQ(run_random_calls(o, seed, 2000), 0) << "blocks " << o.blocks << ", positions " << o.block_positions
                                                    << ", window " << o.window << ", seed " << seed;
    }
  }
}

// The control: writing into shared blocks instead of copying them makes tables read
// other sequences' rows, which the check above sees.
TEST(KvBlocks, WithoutCopiesTablesReadOtherSequencesRows) {
  const ScopedHazard write_shared(Hazard::kWritesSharedKvBlocks);
  const int wrong = run_random_calls({.blocks = 24, .block_positions = 4}, 1, 2000);
  std::printf("positions read from another sequence's writes without copies: %d\n", wrong);
  EXPECT_GT(wrong, 0);
}

}  // namespace
}  // namespace npurt::models
