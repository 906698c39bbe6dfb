// Who may make the objects a Runtime owns: code registries, stream pools and workers.
//
// One registry per device is what makes stream reuse safe: a pool learns of new code
// from its runtime's registry alone, so code published through a second registry
// would reach cores whose streams were never told. Users therefore get registries,
// pools and workers from a Runtime (Runtime::registry, make_stream_pool, make_worker);
// below it only the owners of private pools (a memory context's transfers, a
// worker's slots) and the tests of those layers hold a key.
#pragma once

namespace npurt {
class Runtime;
namespace memory_detail {
class MemoryCore;
}
namespace testing {
struct ExecFactory;
}
}  // namespace npurt

namespace npurt::exec {

class Worker;

class FactoryKey {
 private:
  FactoryKey() = default;
  friend class npurt::Runtime;
  friend class npurt::memory_detail::MemoryCore;
  friend class Worker;
  friend struct npurt::testing::ExecFactory;  // tests of the exec and memory layers
};

}  // namespace npurt::exec
