// Drafts for speculative greedy decoding: guesses of the next tokens that a model's
// verify step then checks in one pass over the weights (models::generate with
// GenerateOptions::speculate). A draft never changes the output, only its speed.
//
//   PromptLookup lookup;
//   std::vector<int32_t> guess = lookup.draft(context, 7);  // up to 7 tokens, maybe none
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace npurt::models {

// A draft source: up to `max_tokens` guesses of the tokens after `context` (the
// prompt and every token produced so far). Returning none asks for a plain step.
using Drafter = std::function<std::vector<int32_t>(std::span<const int32_t> context, int max_tokens)>;

// Prompt lookup (n-gram) drafting: finds the most recent earlier occurrence of the
// longest suffix of the context of max_ngram .. min_ngram tokens, and drafts the
// tokens that followed it. Greedy continuations of small models repeat their prompt
// and themselves, so on such text the drafts are often right; it needs no model.
class PromptLookup {
 public:
  explicit PromptLookup(int max_ngram = 3, int min_ngram = 2) : max_ngram_(max_ngram), min_ngram_(min_ngram) {}
  std::vector<int32_t> draft(std::span<const int32_t> context, int max_tokens) const;
  Drafter drafter() const {
    return [lookup = *this](std::span<const int32_t> context, int n) { return lookup.draft(context, n); };
  }

 private:
  int max_ngram_, min_ngram_;
};

// How many tokens to draft at the next step, so that drafts never cost more than they
// bring. It learns, from the steps it sees, what a plain step costs, what each drafted
// token adds to a verify step, and how often a drafted token is right (p); it drafts
// the d <= the current length that maximises the expected tokens of the step,
// 1 + p + .. + p^d, per unit of its cost, and takes a plain step when no d beats a
// plain step. After a verify step that accepted none, drafting pauses for 1, 2, 4 ..
// 16 steps; after one that accepted some, the length becomes one more than it
// accepted; after one that accepted all, twice as long (up to the maximum).
class DraftPolicy {
 public:
  explicit DraftPolicy(int max_tokens) : max_(max_tokens), length_(max_tokens) {}
  // Tokens to draft at this step; 0: a plain step. Call once per step.
  int next_length();
  // A verify step that checked `drafted` drafts and accepted `accepted` of them; its
  // wall time when known (0: not timed).
  void record(int drafted, int accepted, double seconds = 0);
  // A plain step's wall time.
  void record_plain(double seconds);
  // The draft length a step of these estimates should take (0: a plain step).
  static int best_length(int most, double p, double cost_per_draft);

 private:
  int max_, length_;
  int pause_ = 0, misses_ = 0;
  double step_s_ = 0, per_draft_s_ = 0, p_ = 0.5;
};

}  // namespace npurt::models
