// Randomized differential test of the exact coherence policy against a plain host
// model.
//
// Each sequence creates a few buffers (some tracked) and applies random operations:
// guarded writes and overwrites, raw writes in tracked mode (memcpy, strided loops,
// another thread), raw writes declared with mark_host_written, kernel launches
// (copy, add, accumulate-in-place) on overlapping views and two streams, reads and
// explicit syncs. The model keeps, per float, the newest value and which side holds
// it, and predicts every byte the device must move: exactly the stale bytes of the
// requested range, page-rounded only for raw writes caught by tracking (dirty pages
// become host-newer except their device-newer bytes). After each operation the
// device's counters must match the model's byte counts; reads must return the
// model's values; at the end of a sequence every byte the model says the device
// holds is compared with device memory.
//
// NPURT_DIFF_SEQUENCES and NPURT_DIFF_SEED change the amount and the seed.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memory/memory_test_util.h"

namespace npurt::testing {
namespace {

enum class Side : uint8_t { kUninit, kHost, kDevice, kBoth };

struct ModelBuffer {
  Buffer buffer;
  bool tracked = false;
  std::vector<float> values;  // the newest value of each float
  std::vector<Side> side;     // where it lives
  size_t floats() const { return values.size(); }
};

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

class Differential {
 public:
  Differential(MemoryRig& rig, uint64_t seed)
      : rig_(rig), rng_(seed), page_floats_(PageWriteTracker::page_size() / 4) {}

  // Runs one sequence; returns false (with the log in *why) on the first mismatch.
  bool run_sequence(int ops, std::string* why) {
    log_.str("");
    bufs_.clear();
    const int count = 2 + pick(0, 1);
    for (int i = 0; i < count; ++i) {
      ModelBuffer mb;
      mb.tracked = pick(0, 2) != 0;  // two thirds tracked
      const size_t pages = static_cast<size_t>(pick(1, 3));
      BufferOptions o;
      o.name = "b" + std::to_string(i);
      o.track_writes = mb.tracked;
      o.mechanism =
          mechanisms_[static_cast<size_t>(pick(0, static_cast<int>(mechanisms_.size()) - 1))];
      auto b = rig_.ctx->create_buffer(pages * page_floats_ * 4, o);
      if (!b.ok()) return fail(b.status().to_string(), why);
      mb.buffer = std::move(b).value();
      mb.values.assign(pages * page_floats_, 0.f);
      mb.side.assign(pages * page_floats_, Side::kUninit);
      log_ << "buffer " << i << ": " << pages << " pages";
      if (mb.tracked) log_ << " tracked (" << write_tracking_mechanism_name(o.mechanism) << ")";
      log_ << "\n";
      bufs_.push_back(std::move(mb));
    }
    // Give every float a value first, so kernels never read uninitialized memory.
    for (size_t i = 0; i < bufs_.size(); ++i) {
      if (!overwrite(i, 0, bufs_[i].floats())) return fail("initial overwrite", why);
    }
    if (!settle(why)) return false;
    for (int op = 0; op < ops; ++op) {
      if (!step()) return fail("operation failed", why);
      // Comparing byte counts needs all work executed; doing it only now and then
      // leaves launches in flight across operations, so ordering is exercised too.
      if (pick(0, 3) == 0 && !settle(why)) return false;
    }
    for (size_t i = 0; i < bufs_.size(); ++i) {
      if (!read(i, 0, bufs_[i].floats())) return fail("final read", why);
    }
    if (!settle(why)) return false;
    // (Reading device memory directly moves bytes the model does not count.)
    for (size_t i = 0; i < bufs_.size(); ++i) {
      if (!check_device(i)) return fail("device memory differs from the model", why);
    }
    bufs_.clear();  // frees every buffer
    return true;
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  float value() { return static_cast<float>(pick(-1000, 1000)); }

  bool fail(const std::string& what, std::string* why) {
    *why = what + "\n" + log_.str();
    return false;
  }

  // Device counters must equal the model's bytes once all work has executed.
  bool settle(std::string* why) {
    const hal::Counters now = rig_.counters();
    const uint64_t h2d = now.h2d_bytes - base_.h2d_bytes;
    const uint64_t d2h = now.d2h_bytes - base_.d2h_bytes;
    if (h2d != model_h2d_ || d2h != model_d2h_) {
      std::ostringstream s;
      s << "bytes moved: device h2d " << h2d << " d2h " << d2h << ", model h2d " << model_h2d_
        << " d2h " << model_d2h_;
      return fail(s.str(), why);
    }
    return true;
  }

  View view_of(size_t b, size_t first, size_t count) {
    auto v = bufs_[b].buffer.view(first * 4, count * 4);
    EXPECT_TRUE(v.ok());
    return *v;
  }

  // ---- the model's transitions ----
  // A sync of floats [first, last): the `stale` ones move (4 bytes each, counted
  // in *moved) and become both-valid.
  void model_sync(ModelBuffer& mb, size_t first, size_t last, Side stale, uint64_t* moved) {
    for (size_t i = first; i < last; ++i) {
      if (mb.side[i] == stale) {
        mb.side[i] = Side::kBoth;
        *moved += 4;
      }
    }
  }
  void model_fetch(ModelBuffer& mb, size_t first, size_t last) {
    model_sync(mb, first, last, Side::kDevice, &model_d2h_);
  }
  void model_upload(ModelBuffer& mb, size_t first, size_t last) {
    model_sync(mb, first, last, Side::kHost, &model_h2d_);
  }
  // A raw write caught by tracking on the pages in `pages`.
  void model_dirty_pages(ModelBuffer& mb, const std::set<size_t>& pages) {
    for (size_t p : pages) {
      for (size_t i = p * page_floats_; i < (p + 1) * page_floats_; ++i) {
        if (mb.side[i] != Side::kDevice) mb.side[i] = Side::kHost;
      }
    }
  }

  // ---- operations ----
  bool overwrite(size_t b, size_t first, size_t count) {
    ModelBuffer& mb = bufs_[b];
    log_ << "overwrite b" << b << " [" << first << ", +" << count << ")\n";
    auto g = rig_.ctx->overwrite(view_of(b, first, count));
    if (!g.ok()) return false;
    auto out = g->as<float>();
    for (size_t i = 0; i < count; ++i) {
      mb.values[first + i] = out[i] = value();
      mb.side[first + i] = Side::kHost;
    }
    return true;
  }

  bool guarded_write(size_t b, size_t first, size_t count) {
    ModelBuffer& mb = bufs_[b];
    log_ << "write b" << b << " [" << first << ", +" << count << ")\n";
    model_fetch(mb, first, first + count);
    auto g = rig_.ctx->write(view_of(b, first, count));
    if (!g.ok()) return false;
    auto bytes = g->as<float>();
    for (size_t i = 0; i < count; ++i) {
      if (bytes[i] != mb.values[first + i]) return false;  // the fetch must have happened
      if (pick(0, 1)) bytes[i] = mb.values[first + i] = value();
      mb.side[first + i] = Side::kHost;
    }
    return true;
  }

  bool read(size_t b, size_t first, size_t count) {
    ModelBuffer& mb = bufs_[b];
    log_ << "read b" << b << " [" << first << ", +" << count << ")\n";
    model_fetch(mb, first, first + count);
    auto g = rig_.ctx->read(view_of(b, first, count));
    if (!g.ok()) return false;
    auto got = g->as<float>();
    for (size_t i = 0; i < count; ++i) {
      if (got[i] != mb.values[first + i]) {
        log_ << "  float " << first + i << ": got " << got[i] << " want " << mb.values[first + i]
             << "\n";
        return false;
      }
    }
    return true;
  }

  bool to_device(size_t b, size_t first, size_t count) {
    log_ << "to_device b" << b << " [" << first << ", +" << count << ")\n";
    model_upload(bufs_[b], first, first + count);
    return rig_.ctx->to_device(view_of(b, first, count)).ok();
  }

  bool to_host(size_t b, size_t first, size_t count) {
    log_ << "to_host b" << b << " [" << first << ", +" << count << ")\n";
    model_fetch(bufs_[b], first, first + count);
    return rig_.ctx->to_host(view_of(b, first, count)).ok();
  }

  // Raw writes through the mirror of a tracked buffer, by one of three means.
  bool tracked_raw_write(size_t b, size_t first, size_t count) {
    ModelBuffer& mb = bufs_[b];
    const int how = pick(0, 2);
    const size_t stride = how == 1 ? static_cast<size_t>(pick(2, 5)) : 1;
    std::vector<size_t> index;
    for (size_t i = first; i < first + count; i += stride) index.push_back(i);
    log_ << "raw "
         << (how == 0   ? "memcpy"
             : how == 1 ? "strided"
                        : "thread")
         << " b" << b << " [" << first << ", +" << count << ") stride " << stride << "\n";
    // Device-newer bytes must be fetched before raw writes into them (documented).
    if (std::any_of(index.begin(), index.end(),
                    [&](size_t i) { return mb.side[i] == Side::kDevice; })) {
      if (!to_host(b, first, count)) return false;
    }
    float* raw = reinterpret_cast<float*>(mb.buffer.host_data());
    std::vector<float> vals(index.size());
    for (float& v : vals) v = value();
    auto write_all = [&] {
      if (how == 0) {
        std::memcpy(raw + first, vals.data(), vals.size() * sizeof(float));
      } else {
        for (size_t k = 0; k < index.size(); ++k) raw[index[k]] = vals[k];
      }
    };
    if (how == 2) {
      std::thread writer(write_all);
      writer.join();
    } else {
      write_all();
    }
    std::set<size_t> pages;
    for (size_t k = 0; k < index.size(); ++k) {
      mb.values[index[k]] = vals[k];
      pages.insert(index[k] / page_floats_);
    }
    model_dirty_pages(mb, pages);
    return true;
  }

  // A raw write declared with mark_host_written (any buffer).
  bool marked_raw_write(size_t b, size_t first, size_t count) {
    ModelBuffer& mb = bufs_[b];
    log_ << "raw+mark b" << b << " [" << first << ", +" << count << ")\n";
    std::vector<float> vals(count);
    for (float& v : vals) v = value();
    std::memcpy(reinterpret_cast<float*>(mb.buffer.host_data()) + first, vals.data(),
                count * sizeof(float));
    if (mb.tracked) {
      std::set<size_t> pages;
      for (size_t i = first; i < first + count; ++i) pages.insert(i / page_floats_);
      model_dirty_pages(mb, pages);
    }
    for (size_t i = 0; i < count; ++i) {
      mb.values[first + i] = vals[i];
      mb.side[first + i] = Side::kHost;
    }
    return rig_.ctx->mark_host_written(view_of(b, first, count)).ok();
  }

  struct Arg {
    size_t buffer;
    size_t first;  // in floats, tile-aligned
  };

  // copy (in -> out), add (x + y -> out) or accumulate (acc += x) over `tiles` tiles.
  bool launch() {
    const int kind = pick(0, 2);
    const int inputs = kind == 0 ? 1 : 2;
    size_t min_tiles = SIZE_MAX;
    for (const ModelBuffer& mb : bufs_) min_tiles = std::min(min_tiles, mb.floats() / kTile);
    const size_t tiles =
        static_cast<size_t>(pick(1, static_cast<int>(std::min<size_t>(8, min_tiles))));
    const size_t n = tiles * kTile;
    auto random_arg = [&] {
      const size_t b = static_cast<size_t>(pick(0, static_cast<int>(bufs_.size()) - 1));
      const size_t slots = bufs_[b].floats() / kTile - tiles;
      return Arg{b, static_cast<size_t>(pick(0, static_cast<int>(slots))) * kTile};
    };
    // The written range must be disjoint from, or identical to, each input range:
    // a partial overlap would race inside the kernel itself.
    auto compatible = [&](const Arg& out, const Arg& in) {
      return out.buffer != in.buffer || out.first == in.first || out.first + n <= in.first ||
             in.first + n <= out.first;
    };
    Arg a[3];
    for (int attempt = 0;; ++attempt) {
      if (attempt == 20) return true;  // no valid binding drawn: skip
      for (Arg& x : a) x = random_arg();
      if (kind == 2) {
        if (compatible(a[0], a[1])) break;
      } else if (compatible(a[inputs], a[0]) && (inputs == 1 || compatible(a[inputs], a[1]))) {
        break;
      }
    }
    const hal::StreamId stream = pick(0, 1) ? rig_.stream : rig_.stream2;
    static const char* names[] = {"copy", "add", "accumulate"};
    log_ << "launch " << names[kind] << " tiles " << tiles << " on stream " << stream;
    for (int i = 0; i <= (kind == 2 ? 1 : inputs); ++i) {
      log_ << " b" << a[i].buffer << "@" << a[i].first;
    }
    log_ << "\n";

    // Model: inputs (and acc) synced, values computed from the newest values, outputs device-newer.
    const int read_args = kind == 2 ? 2 : inputs;
    for (int i = 0; i < read_args; ++i) {
      model_upload(bufs_[a[i].buffer], a[i].first, a[i].first + n);
    }
    std::vector<float> result(n);
    for (size_t k = 0; k < n; ++k) {
      const float x = bufs_[a[0].buffer].values[a[0].first + k];
      const float y = inputs == 2 ? bufs_[a[1].buffer].values[a[1].first + k] : 0.f;
      result[k] = kind == 0 ? x : x + y;
    }
    const Arg out = kind == 2 ? a[0] : a[inputs];
    for (size_t k = 0; k < n; ++k) {
      bufs_[out.buffer].values[out.first + k] = result[k];
      bufs_[out.buffer].side[out.first + k] = Side::kDevice;
    }

    std::vector<LaunchArg> args;
    MemoryRig::Which which = MemoryRig::kCopy;
    if (kind == 0) {
      args = {view_of(a[0].buffer, a[0].first, n), view_of(a[1].buffer, a[1].first, n)};
    } else if (kind == 1) {
      which = MemoryRig::kAdd;
      args = {view_of(a[0].buffer, a[0].first, n), view_of(a[1].buffer, a[1].first, n),
              view_of(a[2].buffer, a[2].first, n)};
    } else {
      which = MemoryRig::kAccumulate;
      args = {view_of(a[0].buffer, a[0].first, n), view_of(a[1].buffer, a[1].first, n)};
    }
    const Status s = rig_.launch(which, args, stream);
    if (!s.ok()) log_ << "  " << s.to_string() << "\n";
    return s.ok();
  }

  bool step() {
    const size_t b = static_cast<size_t>(pick(0, static_cast<int>(bufs_.size()) - 1));
    const size_t n = bufs_[b].floats();
    const size_t first = static_cast<size_t>(pick(0, static_cast<int>(n) - 1));
    const size_t count =
        static_cast<size_t>(pick(1, static_cast<int>(std::min(n - first, 3 * page_floats_))));
    switch (pick(0, 9)) {
      case 0: return guarded_write(b, first, count);
      case 1: return overwrite(b, first, count);
      case 2:
      case 3:
        return bufs_[b].tracked ? tracked_raw_write(b, first, count)
                                : marked_raw_write(b, first, count);
      case 4: return marked_raw_write(b, first, count);
      case 5:
      case 6: return launch();
      case 7: return read(b, first, count);
      case 8: return to_device(b, first, count);
      default: return to_host(b, first, count);
    }
  }

  // Every float the model says the device holds matches device memory.
  bool check_device(size_t b) {
    ModelBuffer& mb = bufs_[b];
    const std::vector<float> dev = rig_.device_floats(mb.buffer, mb.buffer.view());
    for (size_t i = 0; i < mb.floats(); ++i) {
      if ((mb.side[i] == Side::kBoth || mb.side[i] == Side::kDevice) && dev[i] != mb.values[i]) {
        log_ << "  device float " << i << " of b" << b << ": " << dev[i] << " want " << mb.values[i]
             << "\n";
        return false;
      }
    }
    return true;
  }

 public:
  void reset_counters() {
    base_ = rig_.counters();
    model_h2d_ = model_d2h_ = 0;
  }

 private:
  MemoryRig& rig_;
  std::mt19937_64 rng_;
  const size_t page_floats_;
  const std::vector<WriteTrackingMechanism> mechanisms_ = tracking_mechanisms();
  std::vector<ModelBuffer> bufs_;
  std::ostringstream log_;
  hal::Counters base_;
  uint64_t model_h2d_ = 0, model_d2h_ = 0;
};

TEST(Differential, ExactPolicyMatchesAHostModelInValuesAndBytesMoved) {
  const uint64_t sequences = env_or("NPURT_DIFF_SEQUENCES", 3000);
  const uint64_t seed = env_or("NPURT_DIFF_SEED", 20240611);
  MemoryRig rig;
  Differential diff(rig, seed);
  for (uint64_t i = 0; i < sequences; ++i) {
    diff.reset_counters();
    std::string why;
    ASSERT_TRUE(diff.run_sequence(12, &why))
        << "sequence " << i << " (seed " << seed << "): " << why;
  }
  const MemoryStats s = rig.ctx->stats();
  EXPECT_GT(s.tracked_pages_collected, 0u);
  EXPECT_GT(s.device_waits, 0u);
  EXPECT_GT(s.host_waits, 0u);
  EXPECT_EQ(s.buffers_live, 0u);
  EXPECT_LE(s.events_live, 16u);
}

}  // namespace
}  // namespace npurt::testing
