#include "hal/sim/launch_scheduler.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "npurt/base/trace.h"

namespace npurt::sim {

using hal::Counters;
using hal::FaultSite;
using hal::KernelArg;
using hal::LaunchParams;

LaunchScheduler::LaunchScheduler(const hal::SimOptions& options, SimMemory& memory, SimCounters& counters,
                                 FaultInjector& faults)
    : opts_(options),
      memory_(memory),
      counters_(counters),
      faults_(faults),
      core_claims_(options.num_cores),
      pool_(pool_workers(options)) {
  for (uint32_t c = 0; c < options.num_cores; ++c) {
    cores_.push_back(std::make_unique<Core>(c, options.local_memory_bytes, options.icache_sets, options.icache_ways,
                                            options.icache_line_bytes));
  }
}

uint32_t LaunchScheduler::pool_workers(const hal::SimOptions& o) {
  uint32_t threads = o.host_threads ? o.host_threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, o.num_cores);
  return threads - 1;  // the launching stream thread is the remaining one
}

Status LaunchScheduler::check(const LaunchParams& p) {
  if (p.grid == 0) return invalid_argument("launch with an empty grid");
  if (p.args.size() > isa::kMaxArgs) {
    return invalid_argument("launch with " + std::to_string(p.args.size()) + " arguments (max " +
                            std::to_string(isa::kMaxArgs) + ")");
  }
  NPURT_RETURN_IF_ERROR(memory_.check_range(p.image, sizeof(isa::ImageHeader), "launch image"));
  for (size_t i = 0; i < p.args.size(); ++i) {
    const KernelArg& a = p.args[i];
    if (a.is_scalar) continue;
    NPURT_RETURN_IF_ERROR(
        memory_.check_range(a.addr, std::max<uint64_t>(a.bytes, 1), "launch argument " + std::to_string(i)));
  }
  return ok_status();
}

Status LaunchScheduler::bind(const LaunchParams& p, LaunchContext& ctx, std::string& name) {
  const auto block = memory_.live_block_containing(p.image, sizeof(isa::ImageHeader));
  if (!block) return out_of_range("launch image at " + hex(p.image) + " is no longer allocated");
  const GlobalMemory& gm = memory_.gm();
  const std::span<const uint8_t> img(gm.ptr(p.image), block->addr + block->bytes - p.image.value());
  auto layout_or = isa::read_image_layout(img);
  if (!layout_or.ok()) return layout_or.status().with_context("launch image at " + hex(p.image));
  const isa::ImageLayout& layout = *layout_or;
  isa::ImageHeader h;
  std::memcpy(&h, img.data(), sizeof h);
  // read_image_layout checked that the sections lie inside the image; names are advisory.
  if (static_cast<uint64_t>(h.name_offset) + h.name_bytes <= h.strings_bytes) {
    name.assign(reinterpret_cast<const char*>(img.data() + h.strings_offset + h.name_offset), h.name_bytes);
  }
  if (p.args.size() != layout.num_args) {
    return invalid_argument("kernel '" + name + "' takes " + std::to_string(layout.num_args) +
                            " arguments, launch passed " + std::to_string(p.args.size()));
  }
  if (layout.local_bytes > opts_.local_memory_bytes) {
    return invalid_argument("kernel '" + name + "' needs " + std::to_string(layout.local_bytes) +
                            " bytes of local memory, cores have " + std::to_string(opts_.local_memory_bytes));
  }
  if ((layout.flags & isa::kImageUsesBarrier) && p.grid > opts_.num_cores) {
    return invalid_argument("kernel '" + name + "' uses a grid barrier: grid " + std::to_string(p.grid) +
                            " exceeds the " + std::to_string(opts_.num_cores) + " cores");
  }
  ctx.gm = &gm;
  ctx.image_addr = p.image.value();
  ctx.code_addr = p.image.value() + layout.code_offset;
  ctx.num_insns = layout.code_bytes / static_cast<uint32_t>(isa::kInsnBytes);
  ctx.grid = p.grid;
  ctx.num_args = layout.num_args;
  ctx.sanitize = opts_.sanitize;
  ctx.constants = ArgBinding{p.image.value() + layout.const_offset, layout.const_bytes, 0, false, true, false};
  for (uint32_t i = 0; i < layout.num_args; ++i) {
    isa::ArgRecord rec;
    std::memcpy(&rec, img.data() + sizeof(isa::ImageHeader) + i * sizeof rec, sizeof rec);
    const KernelArg& a = p.args[i];
    const bool want_scalar = rec.kind == static_cast<uint8_t>(isa::ArgKind::kScalar);
    if (a.is_scalar != want_scalar) {
      return invalid_argument("kernel '" + name + "' argument " + std::to_string(i) + " must be a " +
                              (want_scalar ? "scalar" : "buffer"));
    }
    const auto access = static_cast<isa::Access>(rec.access);
    ctx.args[i] = ArgBinding{a.addr.value(), a.bytes, a.bits, a.is_scalar,
                             access == isa::Access::kIn || access == isa::Access::kInOut,
                             access == isa::Access::kOut || access == isa::Access::kInOut};
  }
  return ok_status();
}

namespace {

// Sanitizer: every block still running must wait at the same barrier instruction. A
// grid barrier counts arrivals, not places, so a barrier inside code that only some
// blocks run pairs with another barrier of the rest and lets them run ahead of data
// not yet written; a launch's blocks reach it in order here, so the results can hide
// it. Reported as a hazard of the first block that waits elsewhere.
bool barriers_agree(const LaunchContext& ctx, const std::vector<BlockState>& blocks, const std::vector<uint8_t>& exited,
                    std::vector<Status>& faults, std::vector<uint32_t>& fault_block) {
  const auto first = std::find(exited.begin(), exited.end(), 0);
  if (first == exited.end()) return true;
  const size_t lead = static_cast<size_t>(first - exited.begin());
  for (size_t c = lead + 1; c < blocks.size(); ++c) {
    if (exited[c] || blocks[c].pc == blocks[lead].pc) continue;
    faults[c] = Status(StatusCode::kHazard,
                       "kernel '" + std::string(ctx.kernel_name) +
                           "': hazard: blocks wait at different barriers: block " + std::to_string(lead) + " after insn " +
                           std::to_string(blocks[lead].pc - 1) + ", block " + std::to_string(c) + " after insn " +
                           std::to_string(blocks[c].pc - 1) + " (a barrier inside code that only some blocks run)");
    fault_block[c] = static_cast<uint32_t>(c);
    return false;
  }
  return true;
}

}  // namespace

Status LaunchScheduler::run(const LaunchParams& p, const LaunchStream& s, std::string& name) {
  LaunchContext ctx;
  NPURT_RETURN_IF_ERROR(bind(p, ctx, name));
  ctx.kernel_name = name;
  std::atomic<bool>& abort = s.abort;
  ctx.abort = &abort;
  std::optional<FaultInjector::Fault> injected = faults_.draw(FaultSite::kKernel, p.grid);
  if (!injected) injected = faults_.draw(FaultSite::kKernelHang, p.grid);
  if (injected) {
    ctx.inject_block = injected->block;
    ctx.inject_instruction = injected->instruction;
    ctx.inject_hang = injected->site == FaultSite::kKernelHang;
    ctx.inject_id = injected->id;
  }

  const uint32_t used = std::min(p.grid, opts_.num_cores);
  CoreClaim held(core_claims_);  // in core order: no deadlock between streams
  while (held.held() < used) {
    if (!held.claim_next(abort)) {
      return aborted("kernel '" + name + "' on stream " + std::to_string(s.id.value()) +
                     " aborted while waiting for core " + std::to_string(held.held()));
    }
  }
  if (s.fresh) {
    for (uint32_t c = 0; c < used; ++c) cores_[c]->icache().invalidate();
    s.fresh = false;
    counters_.bump([&](Counters& k) { k.icache_invalidations += used; });
  }

  std::vector<CoreStats> stats(used);
  std::vector<Status> faults(used);
  std::vector<uint32_t> fault_block(used, UINT32_MAX);
  const bool phased = ctx.grid <= opts_.num_cores;  // one block per core; barriers possible
  std::vector<BlockState> blocks(phased ? used : 0);
  for (uint32_t c = 0; c < blocks.size(); ++c) blocks[c].block_id = c;
  std::vector<uint8_t> exited(used, 0);

  auto run_core = [&](uint32_t c) {
    if (phased) {
      if (exited[c]) return;
      const auto r = cores_[c]->run(blocks[c], ctx, &faults[c], stats[c]);
      if (r == BlockResult::kFaulted) {
        fault_block[c] = c;
        abort.store(true);
      }
      exited[c] = r != BlockResult::kAtBarrier;
      return;
    }
    for (uint32_t blk = c; blk < ctx.grid && !abort.load(std::memory_order_relaxed); blk += opts_.num_cores) {
      BlockState st;
      st.block_id = blk;
      const auto r = cores_[c]->run(st, ctx, &faults[c], stats[c]);
      if (r == BlockResult::kFaulted) {
        fault_block[c] = blk;
        abort.store(true);
        return;
      }
    }
  };
  const bool tracing = trace::enabled();
  auto traced_core = [&](uint32_t c) {
    if (phased && exited[c]) return;
    const double t0 = trace::now_us();
    run_core(c);
    trace::complete("core " + std::to_string(c), name, "core", t0, trace::now_us(),
                    {{"stream", s.id}, {"image", hex(p.image)}, {"grid", p.grid}});
  };
  for (;;) {
    if (tracing) {
      pool_.parallel_for(used, traced_core);
    } else {
      pool_.parallel_for(used, run_core);
    }
    if (!phased || abort.load() || std::all_of(exited.begin(), exited.end(), [](uint8_t e) { return e; })) break;
    if (ctx.sanitize && !barriers_agree(ctx, blocks, exited, faults, fault_block)) break;
  }

  CoreStats total;
  for (const auto& st : stats) {
    total.icache_hits += st.icache_hits;
    total.icache_misses += st.icache_misses;
    total.stale_fetch_hazards += st.stale_fetch_hazards;
    total.uninit_read_hazards += st.uninit_read_hazards;
  }
  // Report the fault of the lowest block: deterministic whatever the thread timing.
  const auto first = std::min_element(fault_block.begin(), fault_block.end());
  const bool faulted = *first != UINT32_MAX;
  counters_.bump([&](Counters& k) {
    ++k.launches;
    k.blocks += p.grid;
    k.icache_hits += total.icache_hits;
    k.icache_misses += total.icache_misses;
    k.hazard_stale_fetch += total.stale_fetch_hazards;
    k.hazard_uninit_read += total.uninit_read_hazards;
    if (faulted) ++k.kernel_faults;
  });
  if (injected) {
    // Whatever the kernel was writing is garbage now.
    for (uint32_t i = 0; i < ctx.num_args; ++i) {
      const ArgBinding& a = ctx.args[i];
      if (a.writable && !a.is_scalar && a.bytes != 0) std::memset(memory_.gm().ptr(a.addr), 0xff, a.bytes);
    }
    const std::string what = "kernel '" + name + "' on stream " + std::to_string(s.id.value()) + ", block " +
                             std::to_string(injected->block) + ", after " + std::to_string(injected->instruction) +
                             " instructions" + (ctx.inject_hang ? ": hung" : "");
    Status reported = faulted ? faults[first - fault_block.begin()]
                              : aborted("kernel '" + name + "' on stream " + std::to_string(s.id.value()) +
                                        " aborted before its injected fault #" + std::to_string(injected->id) +
                                        " struck");
    faults_.error(*injected, reported.code(), what).ignore();  // logged; the core's own error says the rest
    counters_.bump([](Counters& k) { ++k.faults_injected; });
    return reported;
  }
  if (faulted) return faults[first - fault_block.begin()];
  if (s.abort_requested.load()) {
    return aborted("kernel '" + name + "' on stream " + std::to_string(s.id.value()) + " aborted");
  }
  return ok_status();
}

}  // namespace npurt::sim
