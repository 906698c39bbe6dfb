#include "npurt/graph/operator_sequence.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <set>

#include "npurt/base/hazards.h"
#include "npurt/base/math.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/numeric.h"
#include "npurt/isa/verifier.h"

namespace npurt::graph {

using isa::Access;
using isa::DType;
using Arena = BufferPlacement::Arena;

namespace {

constexpr uint64_t kPage = 4096;        // host-writable buffers start on their own page
constexpr uint64_t kDeviceAlign = 256;  // intermediates

// A binding string: "name" or "name[first:last]" (elements, last exclusive).
struct BufferRef {
  std::string name;
  bool slice = false;
  uint64_t first = 0, last = 0;
};

StatusOr<BufferRef> parse_ref(std::string_view text) {
  const size_t open = text.find('[');
  if (open == std::string_view::npos) return BufferRef{std::string(text)};
  const size_t colon = text.find(':', open), close = text.find(']', open);
  const auto bad = [&] {
    return invalid_argument("binding '" + std::string(text) + "' is not name or name[first:last]");
  };
  if (open == 0 || colon == std::string_view::npos || close != text.size() - 1 || colon > close) return bad();
  BufferRef ref{std::string(text.substr(0, open)), true};
  const auto number = [&](size_t from, size_t to, uint64_t* out) {
    const auto [p, ec] = std::from_chars(text.data() + from, text.data() + to, *out);
    return ec == std::errc() && p == text.data() + to && to > from;
  };
  if (!number(open + 1, colon, &ref.first) || !number(colon + 1, close, &ref.last)) return bad();
  if (ref.last <= ref.first) return bad();
  return ref;
}

std::string step_label(size_t i, const ops::Operator& op) {
  return "step " + std::to_string(i) + " (" + op.name() + ")";
}

Status step_error(size_t i, const ops::Operator& op, const std::string& what) {
  return invalid_argument(step_label(i, op) + ": " + what);
}

Access merge(Access a, Access b) { return a == b ? a : Access::kInOut; }

std::shared_ptr<const StreamCommand> as_command(const SequenceStep& st) {
  return std::dynamic_pointer_cast<const StreamCommand>(st.op);
}

// One use of a buffer by a step argument.
struct Use {
  size_t step;
  size_t arg;
  BufferRef ref;
  Access access;
};

struct BufferInfo {
  DType dtype = DType::kF32;
  uint64_t elements = 0;
  std::vector<Use> uses;
};

// The one conversion of a per-call scalar to its argument's type: an f32 argument
// takes an integer or a floating value; an integer argument only an integer (a
// floating value is refused, never truncated).
StatusOr<ops::HostArg> scalar_arg(const std::string& name, DType dtype, const Scalars& scalars) {
  const auto it = scalars.find(name);
  if (it == scalars.end()) return invalid_argument("no value for scalar '" + name + "'");
  const ScalarValue& v = it->second;
  if (dtype == DType::kF32) {
    const double d = std::holds_alternative<double>(v) ? std::get<double>(v) : static_cast<double>(std::get<int64_t>(v));
    return ops::HostArg::f32(static_cast<float>(d));
  }
  if (!std::holds_alternative<int64_t>(v)) {
    return invalid_argument("scalar '" + name + "' is an integer, got a floating value");
  }
  return ops::HostArg::i64(std::get<int64_t>(v));
}

// Every name of `given` must be one of `known` (sorted): a misspelled scalar is an
// error, never silently unused.
Status check_scalar_names(const std::string& sequence, const std::vector<std::string>& known, const Scalars& given) {
  std::string unknown;
  size_t count = 0;
  for (const auto& [name, value] : given) {
    if (std::binary_search(known.begin(), known.end(), name)) continue;
    unknown += (count++ == 0 ? "'" : ", '") + name + "'";
  }
  if (count == 0) return ok_status();
  std::string its;
  for (const std::string& k : known) its += (its.empty() ? "" : ", ") + k;
  return invalid_argument("sequence '" + sequence + "': unknown scalar" + (count > 1 ? "s " : " ") + unknown +
                          (known.empty() ? " (it binds no scalars)" : " (its scalars: " + its + ")"));
}

}  // namespace

OperatorSequence::OperatorSequence(std::string name, std::vector<SequenceStep> steps, std::vector<std::string> inputs,
                                   std::vector<std::string> outputs, std::map<std::string, uint64_t> buffer_sizes,
                                   Dispatch dispatch)
    : name_(std::move(name)),
      steps_(std::move(steps)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      sizes_(std::move(buffer_sizes)),
      dispatch_(dispatch) {}

CompiledSequence::~CompiledSequence() = default;

namespace {

// The checked facts compile() works from.
struct Analysis {
  std::map<std::string, BufferInfo> buffers;
  std::map<std::string, DType> scalars;
};

Status check_step_overlaps(size_t i, const SequenceStep& st, const std::vector<isa::ArgSpec>& sig,
                           const std::map<std::string, BufferInfo>& buffers) {
  // Byte ranges of every buffer argument of this step, in buffer coordinates.
  struct Range {
    size_t arg;
    std::string name;
    uint64_t first, last;
  };
  std::vector<Range> ranges;
  for (size_t a = 0; a < sig.size(); ++a) {
    if (sig[a].is_scalar()) continue;
    auto ref = parse_ref(st.bindings[a]);
    const BufferInfo& info = buffers.at(ref->name);
    ranges.push_back({a, ref->name, ref->slice ? ref->first : 0, ref->slice ? ref->last : info.elements});
  }
  for (size_t x = 0; x < ranges.size(); ++x) {
    for (size_t y = x + 1; y < ranges.size(); ++y) {
      const Range &r = ranges[x], &s = ranges[y];
      if (r.name != s.name || r.last <= s.first || s.last <= r.first) continue;
      const bool rw = sig[r.arg].writes(), sw = sig[s.arg].writes();
      if (!rw && !sw) continue;  // two reads of the same bytes
      const bool exact = r.first == s.first && r.last == s.last;
      if (exact && rw != sw && st.op->in_place_safe()) continue;
      return step_error(i, *st.op, "'" + st.bindings[r.arg] + "' (" + sig[r.arg].name + ") and '" +
                                       st.bindings[s.arg] + "' (" + sig[s.arg].name + ") overlap" +
                                       (exact ? " and this operator cannot work in place"
                                              : "; only an exact in-place binding can be allowed"));
    }
  }
  return ok_status();
}

StatusOr<Analysis> analyze(const std::vector<SequenceStep>& steps, const std::map<std::string, uint64_t>& sizes,
                           const std::vector<std::string>& inputs, const std::vector<std::string>& outputs) {
  if (steps.empty()) return invalid_argument("a sequence needs at least one step");
  Analysis an;
  for (size_t i = 0; i < steps.size(); ++i) {
    const SequenceStep& st = steps[i];
    if (!st.op) return invalid_argument("step " + std::to_string(i) + " has no operator");
    NPURT_RETURN_IF_ERROR(st.op->validate().with_context(step_label(i, *st.op)));
    const std::vector<isa::ArgSpec> sig = st.op->signature();
    if (st.bindings.size() != sig.size()) {
      return step_error(i, *st.op, "binds " + std::to_string(st.bindings.size()) + " names to " +
                                       std::to_string(sig.size()) + " arguments");
    }
    for (size_t a = 0; a < sig.size(); ++a) {
      const std::string& binding = st.bindings[a];
      if (sig[a].is_scalar()) {
        auto [it, fresh] = an.scalars.emplace(binding, sig[a].dtype);
        if (!fresh && it->second != sig[a].dtype) {
          return step_error(i, *st.op, "scalar '" + binding + "' is " + std::string(isa::dtype_name(sig[a].dtype)) +
                                           " here and " + std::string(isa::dtype_name(it->second)) + " elsewhere");
        }
        continue;
      }
      StatusOr<BufferRef> ref = parse_ref(binding);
      if (!ref.ok()) return step_error(i, *st.op, ref.status().message());
      const auto size = sizes.find(ref->name);
      if (size == sizes.end()) {
        return step_error(i, *st.op, "unknown buffer '" + ref->name + "' (bound to " + sig[a].name + "): not in buffer_sizes");
      }
      auto [it, fresh] = an.buffers.emplace(ref->name, BufferInfo{sig[a].dtype, size->second, {}});
      BufferInfo& info = it->second;
      if (!fresh && info.dtype != sig[a].dtype) {
        return step_error(i, *st.op, "buffer '" + ref->name + "' is " + std::string(isa::dtype_name(sig[a].dtype)) +
                                         " for " + sig[a].name + " but " + std::string(isa::dtype_name(info.dtype)) +
                                         " for an earlier binding");
      }
      const uint64_t have = ref->slice ? ref->last - ref->first : info.elements;
      if (ref->slice && ref->last > info.elements) {
        return step_error(i, *st.op, "slice '" + binding + "' ends past buffer '" + ref->name + "' (" +
                                         std::to_string(info.elements) + " elements)");
      }
      if (have != sig[a].elements) {
        return step_error(i, *st.op, "'" + binding + "' has " + std::to_string(have) + " elements but " + sig[a].name +
                                         " needs " + std::to_string(sig[a].elements));
      }
      if (isa::dtype_bytes(info.dtype, have) == 0 ||
          (ref->slice && isa::dtype_bytes(info.dtype, ref->first) == 0 && ref->first != 0)) {
        return step_error(i, *st.op, "slice '" + binding + "' does not fall on whole " +
                                         std::string(isa::dtype_name(info.dtype)) + " blocks");
      }
      info.uses.push_back({i, a, *ref, sig[a].access});
    }
    NPURT_RETURN_IF_ERROR(check_step_overlaps(i, st, sig, an.buffers));
  }
  // A fused kernel has one argument per distinct binding, so a scalar spelled like a
  // buffer binding would be read from the buffer's argument (or the buffer's code
  // from the scalar's); each name is one or the other.
  for (const auto& [scalar, dtype] : an.scalars) {
    const StatusOr<BufferRef> ref = parse_ref(scalar);
    if (ref.ok() && an.buffers.count(ref->name)) {
      return invalid_argument("'" + scalar + "' is bound both as a scalar and as buffer '" + ref->name + "'");
    }
  }
  for (const std::string& in : inputs) {
    const auto it = an.buffers.find(in);
    if (it == an.buffers.end()) return invalid_argument("input '" + in + "' is bound by no step");
    for (const Use& u : it->second.uses) {
      if (u.access != Access::kIn) {
        return step_error(u.step, *steps[u.step].op, "writes input '" + in + "'; inputs are read-only");
      }
    }
  }
  for (const std::string& out : outputs) {
    if (!an.buffers.count(out)) return invalid_argument("output '" + out + "' is bound by no step");
    if (std::find(inputs.begin(), inputs.end(), out) != inputs.end()) {
      return invalid_argument("'" + out + "' is both an input and an output");
    }
  }
  return an;
}

// A scratch buffer is an intermediate when the first step using it writes all of it
// and reads none of it: its bytes before that step never matter.
bool is_intermediate(const BufferInfo& info) {
  const size_t first = info.uses.front().step;
  for (const Use& u : info.uses) {
    if (u.step != first) break;
    if (u.access != Access::kOut || u.ref.slice) return false;
  }
  return true;
}

// Lays out every buffer; intermediates are packed so that two share bytes only when
// their step intervals are disjoint.
std::vector<BufferPlacement> lay_out(const Analysis& an, const std::vector<std::string>& inputs,
                                     const std::vector<std::string>& outputs,
                                     const std::map<std::string, View, std::less<>>& shared,
                                     uint64_t arena_bytes[3]) {
  std::vector<BufferPlacement> placed;
  const auto place = [&](const std::string& name, Arena arena, uint64_t align) {
    const BufferInfo& info = an.buffers.at(name);
    const uint64_t bytes = isa::dtype_bytes(info.dtype, info.elements);
    uint64_t& end = arena_bytes[static_cast<int>(arena)];
    end = round_up(end, align);
    placed.push_back({name, arena, end, bytes, info.dtype, false});
    end += bytes;
  };
  for (const std::string& n : inputs) place(n, Arena::kInput, kPage);
  for (const std::string& n : outputs) place(n, Arena::kOutput, kPage);
  struct Interval {
    std::string name;
    size_t first, last;
    uint64_t bytes;
  };
  std::vector<Interval> intermediates;
  const std::set<std::string> io(inputs.begin(), inputs.end());
  const std::set<std::string> outs(outputs.begin(), outputs.end());
  for (const auto& [name, info] : an.buffers) {
    if (io.count(name) || outs.count(name) || shared.count(name)) continue;
    if (is_intermediate(info)) {
      intermediates.push_back({name, info.uses.front().step, info.uses.back().step,
                               isa::dtype_bytes(info.dtype, info.elements)});
    } else {
      place(name, Arena::kScratch, kPage);
    }
  }
  // Largest first, each at the lowest offset clear of every placed intermediate whose
  // lifetime overlaps its own.
  std::sort(intermediates.begin(), intermediates.end(),
            [](const Interval& a, const Interval& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name; });
  const uint64_t base = round_up(arena_bytes[static_cast<int>(Arena::kScratch)], kPage);
  std::vector<std::pair<Interval, uint64_t>> done;
  uint64_t end = base;
  for (const Interval& iv : intermediates) {
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (const auto& [other, off] : done) {
      if (other.first <= iv.last && iv.first <= other.last) busy.push_back({off, off + other.bytes});
    }
    std::sort(busy.begin(), busy.end());
    uint64_t at = base;
    for (const auto& [lo, hi] : busy) {
      if (at + iv.bytes <= lo) break;
      at = std::max(at, round_up(hi, kDeviceAlign));
    }
    done.push_back({iv, at});
    const BufferInfo& info = an.buffers.at(iv.name);
    placed.push_back({iv.name, Arena::kScratch, at, iv.bytes, info.dtype, true});
    end = std::max(end, at + iv.bytes);
  }
  if (!intermediates.empty()) arena_bytes[static_cast<int>(Arena::kScratch)] = end;
  return placed;
}

}  // namespace

StatusOr<View> CompiledSequence::resolve(std::string_view binding) const {
  NPURT_ASSIGN_OR_RETURN(BufferRef ref, parse_ref(binding));
  if (const auto sh = shared_.find(ref.name); sh != shared_.end()) {
    if (!ref.slice) return sh->second;
    return invalid_argument("slice '" + std::string(binding) + "' of shared buffer '" + ref.name +
                                                    "': shared buffers are bound whole");
  }
  const auto it = std::find_if(placements_.begin(), placements_.end(),
                               [&](const BufferPlacement& p) { return p.name == ref.name; });
  if (it == placements_.end()) {
    return not_found("no buffer '" + ref.name + "' in this sequence");
  }
  const Buffer& arena = arenas_[static_cast<int>(it->arena)];
  if (!ref.slice) return arena.view(it->offset, it->bytes);
  const uint64_t first = isa::dtype_bytes(it->dtype, ref.first), last = isa::dtype_bytes(it->dtype, ref.last);
  if ((ref.first != 0 && first == 0) || last == 0 || last > it->bytes) {
    return out_of_range("slice '" + std::string(binding) + "' is outside buffer '" + ref.name + "'");
  }
  return arena.view(it->offset + first, last - first);
}

StatusOr<View> CompiledSequence::get_buffer(std::string_view name) const { return resolve(name); }

uint64_t CompiledSequence::arena_bytes(Arena arena) const {
  const Buffer& b = arenas_[static_cast<int>(arena)];
  return b.valid() ? b.size() : 0;
}

namespace {

// The fused kernels of a sequence as step ranges [first, last): consecutive steps
// are packed greedily while the distinct bindings of a range fit one kernel's
// arguments, so a sequence of up to kMaxArgs bindings is one launch and a longer one
// (a whole model step) is as few launches as the argument limit allows.
std::vector<std::pair<size_t, size_t>> fused_segments(const std::vector<SequenceStep>& steps) {
  std::vector<std::pair<size_t, size_t>> segments;
  std::set<std::string_view> bound;
  size_t first = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (as_command(steps[i])) {  // a segment of its own, never fused
      if (i > first) segments.emplace_back(first, i);
      segments.emplace_back(i, i + 1);
      first = i + 1;
      bound.clear();
      continue;
    }
    std::set<std::string_view> with = bound;
    with.insert(steps[i].bindings.begin(), steps[i].bindings.end());
    if (with.size() > static_cast<size_t>(isa::kMaxArgs) && i > first) {
      segments.emplace_back(first, i);
      first = i;
      with = std::set<std::string_view>(steps[i].bindings.begin(), steps[i].bindings.end());
    }
    bound = std::move(with);
  }
  if (first < steps.size()) segments.emplace_back(first, steps.size());
  return segments;
}

// The bytes one step reads and writes, as views of the sequence's buffers, and the
// blocks [0, grid) that run it.
struct StepAccess {
  std::vector<View> reads, writes;
  uint32_t grid = 0;
};

bool any_overlap(const std::vector<View>& a, const std::vector<View>& b) {
  for (const View& x : a) {
    for (const View& y : b) {
      if (x.overlaps(y)) return true;
    }
  }
  return false;
}

// Whether `next` reads bytes `since` writes, or writes bytes it reads or writes.
bool conflicts(const StepAccess& next, const StepAccess& since) {
  return any_overlap(next.reads, since.writes) || any_overlap(next.writes, since.reads) ||
         any_overlap(next.writes, since.writes);
}

void append(StepAccess& since, const StepAccess& step) {
  since.reads.insert(since.reads.end(), step.reads.begin(), step.reads.end());
  since.writes.insert(since.writes.end(), step.writes.begin(), step.writes.end());
}

// barrier_after[i]: whether every block must finish steps up to i before any block
// starts step i + 1, because step i + 1 touches bytes that a step since the last
// barrier touched (one of the two writing them), on a block other than its own.
// Independent steps (a layer's q, k and v GEMVs) share a phase. Steps on one block
// (grid 1) all run on block 0, in program order: a chain of them (a norm, an add, the
// next norm) shares a phase too, and only a step on several blocks waits for them. A
// segment's last step needs none: its launch ends when every block has exited.
std::vector<bool> plan_barriers(const std::vector<StepAccess>& steps) {
  std::vector<bool> barrier_after(steps.size(), false);
  StepAccess many, one;  // since the last barrier: steps on several blocks, steps on block 0 alone
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    append(steps[i].grid == 1 ? one : many, steps[i]);
    const StepAccess& next = steps[i + 1];
    if (!conflicts(next, many) && (next.grid == 1 || !conflicts(next, one))) continue;
    barrier_after[i] = true;
    many = {};
    one = {};
  }
  return barrier_after;
}

// What a first emission of a step into a scratch builder tells: its grid (a function
// of the operator's parameters and the target alone), whether its code holds a
// barrier of its own, and the registers it reads before writing them.
struct StepProbe {
  uint32_t grid = 0;
  bool own_barrier = false;
  uint32_t read_first = 0;
};

StatusOr<StepProbe> probe_step(const ops::Operator& op, const ops::EmitContext& ctx) {
  isa::KernelBuilder probe("probe");
  ops::EmitContext probe_ctx{probe, ctx.target, ctx.signature, {}};
  for (const isa::ArgSpec& a : ctx.signature) {
    probe_ctx.args.push_back(a.is_scalar() ? probe.arg_scalar(a.name, a.dtype) : probe.arg_buffer(a.name, a.access, a.dtype));
  }
  StepProbe out;
  NPURT_ASSIGN_OR_RETURN(out.grid, op.emit(probe_ctx));
  const std::span<const isa::Insn> code = probe.code();
  out.own_barrier = std::any_of(code.begin(), code.end(),
                                [](const isa::Insn& in) { return in.op == static_cast<uint8_t>(isa::Opcode::kBarrier); });
  out.read_first = isa::registers_read_first(code);
  return out;
}

// Whether step i sits behind a guard that step i - 1 opened: both on the same blocks,
// fewer than the launch's, with no barrier between them. A run of such steps (a
// layer's head norms, RoPE and cache appends on block 0) shares one guard, which the
// other blocks then pass over once instead of once per step.
std::vector<bool> shares_guard(const std::vector<StepProbe>& probes, const std::vector<bool>& barrier_after,
                               uint32_t launch_grid) {
  std::vector<bool> shares(probes.size() + 1, false);
  for (size_t i = 1; i < probes.size(); ++i) {
    shares[i] = probes[i].grid != launch_grid && probes[i].grid == probes[i - 1].grid && !barrier_after[i - 1];
  }
  return shares;
}

// Code of one fused step: runs on blocks [0, grid) of the launch, with the registers
// it reads before writing cleared as at a block's start, then, if `barrier`, waits
// for every block. A step on fewer blocks than the launch's sits behind a guard (the
// block id against its grid, then a one-iteration loop), opened unless the step
// shares the previous step's (`open`) and closed unless the next one shares it
// (`close`); a step on all `launch_grid` blocks needs none.
struct GuardRun {
  bool open = false, close = false;
};

Status emit_fused_step(isa::KernelBuilder& b, const ops::Operator& op, ops::EmitContext& ctx, const StepProbe& probe,
                       GuardRun guard, bool barrier) {
  if (guard.open) {
    const isa::Reg gate{0}, limit{1};
    b.block_id(gate);
    b.li(limit, probe.grid);
    b.alu(isa::AluOp::kSub, gate, limit, gate);  // grid - block id
    b.alui(isa::AluOp::kMin, gate, gate, 1);
    b.alui(isa::AluOp::kMax, gate, gate, 0);     // 1 on the step's blocks, else 0
    b.loop_begin(gate);
  }
  // Clearing only what the code reads first keeps a token's instruction count (and
  // the cores' instruction fetch) to the operators' own work: operators set what they
  // read, and the library's clear nothing here.
  for (uint8_t r = 0; r < isa::kNumScalarRegs; ++r) {
    if (probe.read_first >> r & 1) b.li(isa::Reg{r}, 0);
  }
  const uint32_t start = b.num_insns();
  NPURT_ASSIGN_OR_RETURN(uint32_t again, op.emit(ctx));
  if (again != probe.grid) return internal_error(op.name() + ": grid changed between emissions");
  if ((isa::registers_read_first(b.code().subspan(start)) & ~probe.read_first) != 0) {
    return internal_error(op.name() + ": registers read first changed between emissions");
  }
  if (guard.close) b.loop_end();
  if (barrier) b.barrier();
  return ok_status();
}

}  // namespace

StatusOr<std::unique_ptr<CompiledSequence>> OperatorSequence::compile(Runtime& runtime,
                                                                      CompileOptions options) const {
  NPURT_RETURN_IF_ERROR(runtime.check_open("compiling sequence '" + name_ + "'"));
  NPURT_ASSIGN_OR_RETURN(Analysis an, analyze(steps_, sizes_, inputs_, outputs_));
  auto seq = std::unique_ptr<CompiledSequence>(new CompiledSequence());
  seq->runtime_ = runtime.shared_from_this();
  seq->name_ = name_;
  seq->dispatch_ = dispatch_;
  seq->outputs_ = outputs_;
  for (const auto& [scalar, dtype] : an.scalars) seq->scalars_.push_back(scalar);
  MemoryContext& memory = runtime.memory();
  exec::CodeRegistry& registry = runtime.registry();
  uint64_t arena_bytes[3] = {0, 0, 0};
  for (const auto& [name, view] : options.shared) {
    const auto it = an.buffers.find(name);
    if (it == an.buffers.end()) return invalid_argument("shared buffer '" + name + "' is bound by no step");
    const uint64_t bytes = isa::dtype_bytes(it->second.dtype, it->second.elements);
    if (view.size() != bytes) {
      return invalid_argument("shared buffer '" + name + "' is " + std::to_string(view.size()) +
                                                      " bytes; the sequence binds " + std::to_string(bytes));
    }
    if (std::count(inputs_.begin(), inputs_.end(), name) || std::count(outputs_.begin(), outputs_.end(), name)) {
      return invalid_argument("shared buffer '" + name + "' cannot be an input or output");
    }
  }
  seq->shared_ = options.shared;
  seq->placements_ = lay_out(an, inputs_, outputs_, options.shared, arena_bytes);
  static const char* kArenaNames[3] = {"inputs", "outputs", "scratch"};
  for (int a = 0; a < 3; ++a) {
    if (arena_bytes[a] == 0) continue;
    BufferOptions o;
    o.name = name_ + "." + kArenaNames[a];
    o.alignment = kPage;
    o.track_writes = a != static_cast<int>(Arena::kOutput);  // host writes are caught by page
    NPURT_ASSIGN_OR_RETURN(seq->arenas_[a], memory.create_buffer(arena_bytes[a], o));
  }

  const ops::Target target = ops::Target::of(memory.device().info());
  using Kernel = CompiledSequence::CompiledKernel;
  // A stream command's arguments, bound as its signature says.
  const auto command_item = [](const SequenceStep& st, std::shared_ptr<const StreamCommand> cmd) {
    Kernel item;
    const auto sig = cmd->signature();
    for (size_t a = 0; a < sig.size(); ++a) {
      item.args.push_back({sig[a].is_scalar(), st.bindings[a], sig[a].dtype, sig[a].access, {}});
    }
    item.command = std::move(cmd);
    return item;
  };
  if (dispatch_ == Dispatch::kSeparate) {
    for (size_t i = 0; i < steps_.size(); ++i) {
      if (auto cmd = as_command(steps_[i])) {
        seq->kernels_.push_back(command_item(steps_[i], std::move(cmd)));
        continue;
      }
      StatusOr<ops::Kernel> k = steps_[i].op->compile(target);
      if (!k.ok()) return k.status().with_context(step_label(i, *steps_[i].op));
      Kernel ck{std::move(k->image), k->grid, {}, {}};
      for (size_t a = 0; a < k->args.size(); ++a) {
        ck.args.push_back({k->args[a].is_scalar(), steps_[i].bindings[a], k->args[a].dtype, k->args[a].access, {}});
      }
      seq->kernels_.push_back(std::move(ck));
    }
  } else {
    for (const auto& [first, last] : fused_segments(steps_)) {
      if (auto cmd = as_command(steps_[first])) {
        seq->kernels_.push_back(command_item(steps_[first], std::move(cmd)));
        continue;
      }
      // One argument per distinct binding of the segment, with the union of its accesses.
      std::vector<CompiledSequence::KernelArgBinding> args;
      std::map<std::string, size_t> index;
      for (size_t i = first; i < last; ++i) {
        const auto sig = steps_[i].op->signature();
        for (size_t a = 0; a < sig.size(); ++a) {
          auto [it, fresh] = index.emplace(steps_[i].bindings[a], args.size());
          if (fresh) {
            args.push_back({sig[a].is_scalar(), steps_[i].bindings[a], sig[a].dtype, sig[a].access, {},
                            sig[a].access == Access::kOut});
          } else if (!sig[a].is_scalar()) {
            args[it->second].access = merge(args[it->second].access, sig[a].access);
          }
        }
      }
      const std::string kernel_name = last - first == steps_.size() ? name_ : name_ + "." + std::to_string(first);
      isa::KernelBuilder b(kernel_name);
      std::vector<uint8_t> arg_index;
      for (const auto& a : args) {
        arg_index.push_back(a.scalar ? b.arg_scalar(a.name, a.dtype) : b.arg_buffer(a.name, a.access, a.dtype));
      }
      std::vector<StepAccess> access;
      std::vector<StepProbe> probes;
      for (size_t i = first; i < last; ++i) {
        const SequenceStep& st = steps_[i];
        const auto sig = st.op->signature();
        ops::EmitContext ctx{b, target, sig, {}};
        StatusOr<StepProbe> probed = probe_step(*st.op, ctx);
        if (!probed.ok()) return probed.status().with_context(step_label(i, *st.op));
        const StepProbe probe = *probed;
        if (probe.grid > target.cores) {
          return step_error(i, *st.op, "needs " + std::to_string(probe.grid) + " blocks; a fused sequence runs on " +
                                           std::to_string(target.cores) + " cores at most");
        }
        probes.push_back(probe);
        StepAccess& a = access.emplace_back();
        a.grid = probe.grid;
        for (size_t j = 0; j < sig.size(); ++j) {
          if (sig[j].is_scalar()) continue;
          NPURT_ASSIGN_OR_RETURN(View v, seq->resolve(st.bindings[j]));
          if (sig[j].access != Access::kOut) a.reads.push_back(v);
          if (sig[j].access != Access::kIn) a.writes.push_back(v);
        }
      }
      std::vector<bool> barrier_after = plan_barriers(access);
      if (hazard_on(Hazard::kNoStepBarriers)) barrier_after.assign(barrier_after.size(), false);
      uint32_t grid = 1;
      for (const StepProbe& probe : probes) grid = std::max(grid, probe.grid);
      const std::vector<bool> shares = shares_guard(probes, barrier_after, grid);
      std::vector<std::pair<size_t, uint32_t>> barrier_steps;  // steps with a barrier of their own, and their grid
      for (size_t i = first; i < last; ++i) {
        const SequenceStep& st = steps_[i];
        const size_t k = i - first;
        const StepProbe& probe = probes[k];
        const bool guarded = probe.grid != grid;
        const GuardRun guard{guarded && !shares[k], guarded && !shares[k + 1]};
        ops::EmitContext ctx{b, target, st.op->signature(), {}};
        for (const std::string& binding : st.bindings) ctx.args.push_back(arg_index[index.at(binding)]);
        NPURT_RETURN_IF_ERROR(
            emit_fused_step(b, *st.op, ctx, probe, guard, barrier_after[k]).with_context(step_label(i, *st.op)));
        if (probe.own_barrier) barrier_steps.emplace_back(i, probe.grid);
      }
      // Blocks outside a step's grid skip its code: a barrier inside it would pair with
      // some other barrier of theirs, so such a step must run on every block.
      for (const auto& [i, step_grid] : barrier_steps) {
        if (step_grid == grid) continue;
        return step_error(i, *steps_[i].op, "has a grid barrier but runs on " + std::to_string(step_grid) +
                                                " blocks of the launch's " + std::to_string(grid));
      }
      b.exit();
      NPURT_ASSIGN_OR_RETURN_CTX(isa::Image image, b.build(target.local_bytes), "fusing " + kernel_name);
      seq->kernels_.push_back({std::move(image), grid, {}, std::move(args)});
    }
  }
  for (Kernel& k : seq->kernels_) {
    for (CompiledSequence::KernelArgBinding& a : k.args) {
      if (a.scalar) continue;
      NPURT_ASSIGN_OR_RETURN(a.view, seq->resolve(a.name));
    }
    if (k.command) continue;
    NPURT_ASSIGN_OR_RETURN(k.code, registry.register_image(*k.image));
    k.image.reset();  // the registry holds it now, for as long as k.code does
    seq->code_.push_back(k.code);
  }
  // After the code is registered, so the pool's first stream is fresh for all of it.
  NPURT_ASSIGN_OR_RETURN(seq->streams_,
                         runtime.make_stream_pool("sequence '" + name_ + "'"));
  return seq;
}

Status OperatorSequence::run_reference(std::map<std::string, std::vector<uint8_t>>& buffers,
                                       const Scalars& scalars) const {
  NPURT_ASSIGN_OR_RETURN(Analysis an, analyze(steps_, sizes_, inputs_, outputs_));
  std::vector<std::string> known;
  for (const auto& [scalar, dtype] : an.scalars) known.push_back(scalar);
  NPURT_RETURN_IF_ERROR(check_scalar_names(name_, known, scalars));
  for (const auto& [name, info] : an.buffers) {
    std::vector<uint8_t>& b = buffers[name];
    const uint64_t bytes = isa::dtype_bytes(info.dtype, info.elements);
    if (b.size() != bytes) {
      if (!b.empty()) return invalid_argument("host buffer '" + name + "' has the wrong size");
      b.assign(bytes, 0);
    }
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    const SequenceStep& st = steps_[i];
    const auto sig = st.op->signature();
    std::vector<ops::HostArg> args;
    for (size_t a = 0; a < sig.size(); ++a) {
      if (sig[a].is_scalar()) {
        NPURT_ASSIGN_OR_RETURN(ops::HostArg v, scalar_arg(st.bindings[a], sig[a].dtype, scalars));
        args.push_back(v);
        continue;
      }
      NPURT_ASSIGN_OR_RETURN(BufferRef ref, parse_ref(st.bindings[a]));
      std::span<uint8_t> bytes(buffers[ref.name]);
      if (ref.slice) {
        const uint64_t first = isa::dtype_bytes(sig[a].dtype, ref.first);
        bytes = bytes.subspan(first, isa::dtype_bytes(sig[a].dtype, ref.last) - first);
      }
      args.push_back(ops::HostArg::buffer(bytes));
    }
    NPURT_RETURN_IF_ERROR(st.op->reference(args).with_context(step_label(i, *st.op)));
  }
  return ok_status();
}

Status CompiledSequence::check_scalars(const Scalars& scalars) const {
  return check_scalar_names(name_, scalars_, scalars);
}

Status CompiledSequence::enqueue(hal::StreamId stream, const Scalars& scalars) {
  NPURT_RETURN_IF_ERROR(check_scalars(scalars));
  // No raw write of ours happens between the kernels: each tracked arena's pages are
  // scanned once, not once per kernel and view.
  const MemoryContext::RawWriteScan scan = runtime_->memory().scan_raw_writes_once();
  std::vector<LaunchArg> args;
  for (const CompiledKernel& k : kernels_) {
    args.clear();
    args.reserve(k.args.size());
    for (const KernelArgBinding& a : k.args) {
      if (!a.scalar) {
        args.push_back(a.access == Access::kIn    ? LaunchArg::input(a.view)
                       : a.access == Access::kOut ? LaunchArg::output(a.view)
                       : a.written_first          ? LaunchArg::written_first(a.view)
                                                  : LaunchArg::inout(a.view));
        continue;
      }
      NPURT_ASSIGN_OR_RETURN(ops::HostArg v, scalar_arg(a.name, a.dtype, scalars));
      args.push_back(a.dtype == DType::kF32 ? LaunchArg::scalar_f32(v.as_f32()) : LaunchArg::scalar_i64(v.as_i64()));
    }
    if (k.command) {
      NPURT_RETURN_IF_ERROR(k.command->enqueue(stream, args).with_context("sequence '" + name_ + "'"));
      continue;
    }
    NPURT_RETURN_IF_ERROR(runtime_->memory().launch(stream, k.code, k.grid, args));
  }
  return ok_status();
}

size_t CompiledSequence::launches_per_call() const {
  return static_cast<size_t>(
      std::count_if(kernels_.begin(), kernels_.end(), [](const CompiledKernel& k) { return !k.command; }));
}

size_t CompiledSequence::barriers_per_call() const {
  size_t n = 0;
  for (const CompiledKernel& k : kernels_) {
    const isa::Image* image = k.code.image();
    if (image == nullptr) continue;
    const std::span<const isa::Insn> code = image->code();
    n += static_cast<size_t>(std::count_if(code.begin(), code.end(), [](const isa::Insn& i) {
      return static_cast<isa::Opcode>(i.op) == isa::Opcode::kBarrier;
    }));
  }
  return n;
}

// One use of the sequence's stream pool: reused while nothing was published, fresh
// and primed otherwise, replaced after a failure (exec/stream_pool.h).
Status CompiledSequence::call(const Scalars& scalars) {
  NPURT_RETURN_IF_ERROR(start(scalars));
  return finish();
}

Status CompiledSequence::start(const Scalars& scalars) {
  if (running_) return failed_precondition("sequence '" + name_ + "': start() again before finish()");
  NPURT_RETURN_IF_ERROR(runtime_->check_open("sequence '" + name_ + "'"));
  NPURT_RETURN_IF_ERROR(check_scalars(scalars));  // before a stream is taken (and primed)
  NPURT_ASSIGN_OR_RETURN(exec::SlotLease lease, streams_->acquire());
  Status enqueued = enqueue(lease.stream, scalars);
  if (!enqueued.ok()) {
    // What was enqueued before the error still drains; its own failure is told too.
    if (Status drained = streams_->finish(lease); !drained.ok()) {
      return Status(enqueued.code(), enqueued.message() + "; the stream failed too: " + drained.to_string());
    }
    return enqueued;
  }
  running_ = lease;
  return ok_status();
}

Status CompiledSequence::finish() {
  if (!running_) return failed_precondition("sequence '" + name_ + "': finish() without start()");
  Status run = streams_->finish(*running_);
  running_.reset();
  NPURT_RETURN_IF_ERROR(run);
  for (const std::string& out : outputs_) {
    NPURT_ASSIGN_OR_RETURN(View v, resolve(out));
    NPURT_RETURN_IF_ERROR(runtime_->memory().to_host(v));
  }
  return ok_status();
}

}  // namespace npurt::graph
