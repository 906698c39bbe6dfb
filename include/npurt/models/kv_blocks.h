// KvBlocks: the bookkeeping of a paged KV cache, on the host.
//
//   auto kv = models::KvBlocks::create({.blocks = 256, .block_positions = 16});
//   StatusOr<uint32_t> shared = kv->add(seq, prompt);          // positions already cached
//   StatusOr<models::AppendPlan> plan = kv->append(seq, std::span(prompt).subspan(*shared));
//   // device: copy plan->copies, then write the new keys and values at plan->rows
//
// The cache is a pool of `blocks` blocks of `block_positions` positions each (every
// layer's keys and values of those positions); a sequence's block table names the
// block of each run of block_positions positions, so position p lives in row
// table[p / block_positions] * block_positions + p % block_positions of the pool.
//
// Blocks are reference-counted and shared:
// - A prompt's prefix: a full block whose tokens, and every token before them, equal
//   those of a block already computed is taken instead of computed again (add()
//   returns the positions it spares; the prompt's last token is always left to run,
//   as its logits are wanted). A block becomes findable once append() fills it.
//   Only prompt tokens are found: a block holding a generated token (append() with
//   TokenOrigin::kGenerated) is never taken by add(), since a prompt's tokens may be
//   computed as matrix work that sums in another order than the decode step that
//   computed the generated one, and a request's output must not depend on whose
//   blocks it found.
// - fork(): a child starts with its parent's blocks (n samples of one prompt).
// A sequence writes only into a block it holds alone and no one can find: append()
// first moves it to a fresh copy of any other block it would write into
// (AppendPlan::copies, which the caller performs before the step that writes). So no
// write through one sequence's table is ever seen through another's.
//
// Blocks no sequence holds stay findable until the pool needs them (least recently
// released first). Running out of blocks fails the call, names it and changes nothing:
// the caller preempts a sequence (remove(), later add() again) and retries.
//
// With a sliding window (window > 0, for local-attention layers) a sequence holds only
// the blocks its next queries can attend: append() releases those wholly before the
// first new position's window, and their table entries read kNoBlock.
//
// Pure bookkeeping: it holds no device memory and runs nothing. Decisions take effect
// in the order the caller's steps run, so a step that reads a shared block runs after
// the one that wrote it (one stream).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "npurt/base/status.h"

namespace npurt::models {

struct KvBlocksOptions {
  uint32_t blocks = 0;            // in the pool, >= 1
  uint32_t block_positions = 16;  // positions per block, >= 1
  uint32_t window = 0;            // keep only the blocks of the last `window` positions; 0: all
};

// Copy every row of block `from` to block `to` (before the step writes).
struct BlockCopy {
  uint32_t from = 0, to = 0;
};

// How an appended token came to be: part of a prompt, or chosen by the model.
enum class TokenOrigin : uint8_t { kPrompt, kGenerated };

struct AppendPlan {
  std::vector<BlockCopy> copies;  // to perform first, in order
  std::vector<uint32_t> rows;     // the pool row of each appended token's position
};

class KvBlocks {
 public:
  using SequenceId = uint64_t;
  static constexpr uint32_t kNoBlock = UINT32_MAX;

  static StatusOr<KvBlocks> create(const KvBlocksOptions& options);

  // A new sequence `id` whose first tokens will be `prompt` (non-empty): takes the
  // longest run of its full blocks that is cached, up to the block before the one
  // holding the last token, and returns how many positions that covers (the sequence's
  // length; append() the rest of the prompt).
  StatusOr<uint32_t> add(SequenceId id, std::span<const int32_t> prompt);
  // A new sequence `child` holding what `parent` holds (same length and tokens).
  Status fork(SequenceId parent, SequenceId child);
  // Positions length() .. length() + n - 1 of `id` for `tokens` (n of them): the rows
  // they go to, and the copies to make first. All or nothing.
  StatusOr<AppendPlan> append(SequenceId id, std::span<const int32_t> tokens,
                              TokenOrigin origin = TokenOrigin::kPrompt);
  // Drops positions from `length` on (0 .. length(id)): a rewind, rejected drafts.
  Status truncate(SequenceId id, uint32_t length);
  // Ends `id`, releasing its blocks.
  Status remove(SequenceId id);

  // The block of each run of block_positions positions of `id` (kNoBlock: released by
  // the window), and the positions it has.
  StatusOr<std::span<const uint32_t>> table(SequenceId id) const;
  StatusOr<uint32_t> length(SequenceId id) const;

  uint32_t block_positions() const { return options_.block_positions; }
  uint32_t total_blocks() const { return options_.blocks; }
  // Blocks some sequence holds; blocks held by none but still findable; the rest.
  uint32_t held_blocks() const { return held_; }
  uint32_t cached_blocks() const { return static_cast<uint32_t>(idle_.size()); }
  uint32_t free_blocks() const { return options_.blocks - held_; }  // cached ones included
  size_t sequences() const { return seqs_.size(); }

 private:
  // What identifies a full block's content: the block before it (and that block's
  // generation, so a reused block never matches) and its tokens.
  using Key = std::vector<int64_t>;
  struct Block {
    uint32_t refs = 0;
    uint64_t generation = 0;
    bool findable = false;  // in index_ under key
    Key key;
    uint64_t released_at = 0;  // when refs last fell to 0, its place in idle_
  };
  struct Sequence {
    std::vector<uint32_t> table;
    std::vector<int32_t> tokens;
    std::vector<bool> generated;  // per position: appended as TokenOrigin::kGenerated
  };

  explicit KvBlocks(const KvBlocksOptions& o);
  StatusOr<Sequence*> find(SequenceId id);
  StatusOr<const Sequence*> find(SequenceId id) const;
  // The key of block `index` of s (its tokens, and the block before it); empty when
  // the block before it was released by the window.
  Key key_of(const Sequence& s, size_t index) const;
  // n free blocks (n <= free_blocks()), spare ones first, then the least recently
  // released findable ones, which stop being findable; each one's generation moves on.
  std::vector<uint32_t> take(uint32_t n);
  void hold(uint32_t b);
  void release(uint32_t b);
  // Block b can no longer be found (its content is about to change).
  void forget(uint32_t b);
  // Blocks append() needs for `n` more positions of `s` (new ones and copies).
  uint32_t blocks_needed(const Sequence& s, uint32_t n) const;
  // Whether writing block b would be seen through another table.
  bool shared(uint32_t b) const;
  // Releases the blocks wholly before the window of a query at `query`.
  void release_outside_window(Sequence& s, uint32_t query);
  // Makes block `index` of s findable once full, unless its chain is broken, it holds
  // a generated token or an identical block already is findable.
  void publish(const Sequence& s, size_t index);

  KvBlocksOptions options_;
  std::vector<Block> blocks_;
  std::vector<uint32_t> spare_;  // free blocks no one can find: taken before cached ones
  std::set<std::pair<uint64_t, uint32_t>> idle_;  // free findable blocks, least recently released first
  std::map<Key, uint32_t> index_;
  std::unordered_map<SequenceId, Sequence> seqs_;
  uint32_t held_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace npurt::models
