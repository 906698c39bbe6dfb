// LaunchPlan: what MemoryContext::launch() would do, as MemoryContext::plan_launch()
// reports it without doing it.
//
// A launch is planned (its arguments checked, the stale input bytes to upload, the
// earlier work to wait for, what each argument reads and writes), then executed
// (the waits, uploads and the launch enqueued, the completion recorded), then its
// effects committed to the buffers' coherence and dependency state. Planning
// enqueues nothing and changes no state: planning twice gives the same plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "npurt/isa/image.h"
#include "npurt/memory/coherence_map.h"

namespace npurt {

struct LaunchPlan {
  struct Upload {
    std::string buffer;  // the buffer's name
    ByteRange range;     // bytes of the buffer; a byte bound twice is uploaded once
    friend bool operator==(const Upload&, const Upload&) = default;
  };
  struct Binding {
    std::string buffer;
    ByteRange range;  // the view, in bytes of its buffer
    isa::Access access;  // what the kernel does with the bytes
    friend bool operator==(const Binding&, const Binding&) = default;
  };

  std::vector<Upload> uploads;    // grouped by buffer, by increasing offset
  std::vector<Binding> bindings;  // the buffer arguments, in order
  size_t waits = 0;               // earlier work on other streams the launch waits for

  uint64_t upload_bytes() const {
    uint64_t n = 0;
    for (const Upload& u : uploads) n += u.range.size();
    return n;
  }
  friend bool operator==(const LaunchPlan&, const LaunchPlan&) = default;
};

}  // namespace npurt
