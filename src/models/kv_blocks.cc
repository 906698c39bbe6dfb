#include "npurt/models/kv_blocks.h"

#include <algorithm>
#include <string>

#include "models/find_entry.h"
#include "npurt/base/hazards.h"

namespace npurt::models {
namespace {

std::string seq_name(KvBlocks::SequenceId id) { return "kv blocks: sequence " + std::to_string(id); }

}  // namespace

StatusOr<KvBlocks> KvBlocks::create(const KvBlocksOptions& options) {
  if (options.blocks == 0) return invalid_argument("kv blocks: blocks is 0; the pool needs at least one");
  if (options.block_positions == 0) return invalid_argument("kv blocks: block_positions is 0");
  if (uint64_t{options.blocks} * options.block_positions > UINT32_MAX) {
    return invalid_argument("kv blocks: blocks x block_positions (" + std::to_string(options.blocks) + " x " +
                            std::to_string(options.block_positions) + ") exceeds the 2^32 rows a table can name");
  }
  return KvBlocks(options);
}

KvBlocks::KvBlocks(const KvBlocksOptions& o) : options_(o), blocks_(o.blocks) {
  spare_.reserve(o.blocks);
  for (uint32_t b = o.blocks; b > 0; --b) spare_.push_back(b - 1);  // block 0 is taken first
}

StatusOr<KvBlocks::Sequence*> KvBlocks::find(SequenceId id) { return find_entry(seqs_, id, seq_name); }

StatusOr<const KvBlocks::Sequence*> KvBlocks::find(SequenceId id) const { return find_entry(seqs_, id, seq_name); }

KvBlocks::Key KvBlocks::key_of(const Sequence& s, size_t index) const {
  const uint32_t bp = options_.block_positions;
  Key key;
  key.reserve(2 + bp);
  if (index == 0) {
    key.insert(key.end(), {-1, 0});
  } else {
    const uint32_t parent = s.table[index - 1];
    if (parent == kNoBlock) return {};
    key.insert(key.end(), {int64_t{parent}, static_cast<int64_t>(blocks_[parent].generation)});
  }
  for (size_t p = index * bp; p < (index + 1) * bp; ++p) key.push_back(s.tokens[p]);
  return key;
}

std::vector<uint32_t> KvBlocks::take(uint32_t n) {
  std::vector<uint32_t> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t b;
    if (!spare_.empty()) {
      b = spare_.back();
      spare_.pop_back();
    } else {
      b = idle_.begin()->second;
      idle_.erase(idle_.begin());
      forget(b);
    }
    ++blocks_[b].generation;
    out.push_back(b);
  }
  return out;
}

void KvBlocks::hold(uint32_t b) {
  Block& k = blocks_[b];
  if (k.refs++ > 0) return;
  ++held_;
  if (k.findable) idle_.erase({k.released_at, b});
}

void KvBlocks::release(uint32_t b) {
  Block& k = blocks_[b];
  if (--k.refs > 0) return;
  --held_;
  if (k.findable) {
    k.released_at = ++clock_;
    idle_.insert({k.released_at, b});
  } else {
    spare_.push_back(b);
  }
}

void KvBlocks::forget(uint32_t b) {
  Block& k = blocks_[b];
  if (!k.findable) return;
  index_.erase(k.key);
  k.key.clear();
  k.findable = false;
  ++k.generation;  // blocks keyed on this one no longer match
}

bool KvBlocks::shared(uint32_t b) const { return blocks_[b].refs > 1 && !hazard_on(Hazard::kWritesSharedKvBlocks); }

void KvBlocks::publish(const Sequence& s, size_t index) {
  const uint32_t b = s.table[index];
  Block& k = blocks_[b];
  if (k.findable) return;
  const uint32_t bp = options_.block_positions;
  const auto first = s.generated.begin() + static_cast<std::ptrdiff_t>(index * bp);
  if (std::find(first, first + bp, true) != first + bp) return;
  Key key = key_of(s, index);
  if (key.empty() || index_.contains(key)) return;
  index_.emplace(key, b);
  k.key = std::move(key);
  k.findable = true;
}

void KvBlocks::release_outside_window(Sequence& s, uint32_t query) {
  if (options_.window == 0 || query < options_.window) return;
  // Positions before query - window + 1 are out of every later query's reach.
  const size_t whole = (query - options_.window + 1) / options_.block_positions;
  for (size_t j = 0; j < whole && j < s.table.size(); ++j) {
    if (s.table[j] == kNoBlock) continue;
    release(s.table[j]);
    s.table[j] = kNoBlock;
  }
}

StatusOr<uint32_t> KvBlocks::add(SequenceId id, std::span<const int32_t> prompt) {
  if (seqs_.contains(id)) return invalid_argument(seq_name(id) + " already exists");
  if (prompt.empty()) return invalid_argument(seq_name(id) + ": the prompt is empty");
  const uint32_t bp = options_.block_positions;
  Sequence s;
  const size_t most = (prompt.size() - 1) / bp;  // the last token's block is run
  for (size_t j = 0; j < most; ++j) {
    s.tokens.insert(s.tokens.end(), prompt.begin() + static_cast<std::ptrdiff_t>(j * bp),
                    prompt.begin() + static_cast<std::ptrdiff_t>((j + 1) * bp));
    const auto it = index_.find(key_of(s, j));
    if (it == index_.end()) {
      s.tokens.resize(j * bp);
      break;
    }
    hold(it->second);
    s.table.push_back(it->second);
  }
  const auto length = static_cast<uint32_t>(s.tokens.size());
  s.generated.assign(length, false);
  release_outside_window(s, length);
  seqs_.emplace(id, std::move(s));
  return length;
}

Status KvBlocks::fork(SequenceId parent, SequenceId child) {
  NPURT_ASSIGN_OR_RETURN(Sequence * p, find(parent));
  if (seqs_.contains(child)) return invalid_argument(seq_name(child) + " already exists");
  for (uint32_t b : p->table) {
    if (b != kNoBlock) hold(b);
  }
  Sequence copy = *p;  // before emplace: it may move p
  seqs_.emplace(child, std::move(copy));
  return ok_status();
}

uint32_t KvBlocks::blocks_needed(const Sequence& s, uint32_t n) const {
  const uint32_t bp = options_.block_positions;
  const size_t first = s.tokens.size() / bp, last = (s.tokens.size() + n - 1) / bp;
  uint32_t need = 0;
  for (size_t j = first; j <= last; ++j) {
    if (j >= s.table.size() || s.table[j] == kNoBlock || shared(s.table[j])) ++need;
  }
  return need;
}

StatusOr<AppendPlan> KvBlocks::append(SequenceId id, std::span<const int32_t> tokens, TokenOrigin origin) {
  NPURT_ASSIGN_OR_RETURN(Sequence * s, find(id));
  AppendPlan plan;
  if (tokens.empty()) return plan;
  const uint32_t bp = options_.block_positions;
  const size_t start = s->tokens.size();
  if (start + tokens.size() > UINT32_MAX) return out_of_range(seq_name(id) + ": more than 2^32 positions");
  const auto n = static_cast<uint32_t>(tokens.size());
  const uint32_t need = blocks_needed(*s, n);
  if (need > free_blocks()) {
    return resource_exhausted(seq_name(id) + " needs " + std::to_string(need) + " more blocks for " +
                              std::to_string(n) + " positions; " + std::to_string(free_blocks()) + " of the pool's " +
                              std::to_string(options_.blocks) + " are free (preempt a sequence and retry)");
  }
  std::vector<uint32_t> fresh = take(need);
  const size_t first = start / bp, last = (start + n - 1) / bp;
  for (size_t j = first; j <= last; ++j) {
    if (j == s->table.size()) s->table.push_back(kNoBlock);
    const uint32_t b = s->table[j];
    if (b != kNoBlock && !shared(b)) {
      forget(b);  // its content changes: no longer what its key says
      ++blocks_[b].generation;
      continue;
    }
    const uint32_t to = fresh.back();
    fresh.pop_back();
    hold(to);
    if (b != kNoBlock) {  // shared: the rows before `start` move to a copy
      plan.copies.push_back({b, to});
      release(b);
    }
    s->table[j] = to;
  }
  s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  s->generated.resize(s->tokens.size(), origin == TokenOrigin::kGenerated);
  plan.rows.reserve(n);
  for (size_t p = start; p < start + n; ++p) plan.rows.push_back(s->table[p / bp] * bp + static_cast<uint32_t>(p % bp));
  for (size_t j = first; j <= last; ++j) {
    if ((j + 1) * bp <= s->tokens.size()) publish(*s, j);
  }
  release_outside_window(*s, static_cast<uint32_t>(start));
  return plan;
}

Status KvBlocks::truncate(SequenceId id, uint32_t length) {
  NPURT_ASSIGN_OR_RETURN(Sequence * s, find(id));
  if (length > s->tokens.size()) {
    return out_of_range(seq_name(id) + ": truncate to " + std::to_string(length) + " positions, it has " +
                        std::to_string(s->tokens.size()));
  }
  const uint32_t bp = options_.block_positions;
  if (options_.window > 0 && length > 0) {
    // The next query, at `length`, reads back to length - window + 1.
    const uint32_t from = length >= options_.window ? length - options_.window + 1 : 0;
    for (uint32_t j = from / bp; j <= (length - 1) / bp; ++j) {
      if (s->table[j] == kNoBlock) {
        return failed_precondition(seq_name(id) + ": truncate to " + std::to_string(length) +
                                   " positions needs position " + std::to_string(j * bp) +
                                   " on, which the window released");
      }
    }
  }
  const size_t keep = (length + bp - 1) / bp;
  for (size_t j = keep; j < s->table.size(); ++j) {
    if (s->table[j] != kNoBlock) release(s->table[j]);
  }
  s->table.resize(keep);
  s->tokens.resize(length);
  s->generated.resize(length);
  return ok_status();
}

Status KvBlocks::remove(SequenceId id) {
  NPURT_ASSIGN_OR_RETURN(Sequence * s, find(id));
  for (uint32_t b : s->table) {
    if (b != kNoBlock) release(b);
  }
  seqs_.erase(id);
  return ok_status();
}

StatusOr<std::span<const uint32_t>> KvBlocks::table(SequenceId id) const {
  NPURT_ASSIGN_OR_RETURN(const Sequence* s, find(id));
  return std::span<const uint32_t>(s->table);
}

StatusOr<uint32_t> KvBlocks::length(SequenceId id) const {
  NPURT_ASSIGN_OR_RETURN(const Sequence* s, find(id));
  return static_cast<uint32_t>(s->tokens.size());
}

}  // namespace npurt::models
