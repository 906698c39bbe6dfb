// A launch holds its code: the image stays resident until the launch has run, however
// soon the caller drops its handle, so no other image can take its address meanwhile.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hal/sim_test_util.h"
#include "memory/memory_test_util.h"
#include "npurt/memory/memory_context.h"

namespace npurt::testing {
namespace {

// out = 2 * in: the same arguments as the copy kernel, other code.
StatusOr<isa::Image> doubling_kernel() {
  using namespace isa;
  KernelBuilder b("double");
  const uint8_t in = b.arg_buffer("in", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg off{0}, bid{1};
  const Tile t{0};
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, kTileBytes);
  b.tdef(t, DType::kF32, 1, kTile, 0);
  b.tld(t, in, off, DType::kF32);
  b.tbin(BinOp::kAdd, t, t, t);
  b.tst(t, out, off, DType::kF32);
  b.exit();
  return b.build();
}

struct Outcome {
  bool replacement_took_the_address = false;
  bool output_is_the_copy = false;
  uint64_t freed_while_queued = 0;
  uint64_t freed_after = 0;
};

// Launches a copy kernel registered for this launch alone behind a closed gate, drops
// the only handle, registers other code of the same size, then lets the launch run.
Outcome drop_the_handle_of_a_queued_launch(bool hold) {
  MemoryRig rig(only_if(!hold, Hazard::kLaunchesDropTheirCode));
  constexpr uint64_t kBytes = 8 * kTileBytes;
  Buffer x = rig.buffer(kBytes, "x");
  Buffer out = rig.buffer(kBytes, "out");
  const std::vector<float> xs = random_floats(kBytes / 4, 11);
  write_floats(*rig.ctx, x.view(), xs);
  write_floats(*rig.ctx, out.view(), std::vector<float>(kBytes / 4, std::nanf("")));

  StatusOr<isa::Image> copy = tile_copy_kernel("copy once", false, false);
  StatusOr<isa::Image> other = doubling_kernel();
  EXPECT_TRUE(copy.ok() && other.ok());
  StatusOr<exec::CodeHandle> code = rig.registry->register_image(*copy);
  EXPECT_TRUE(code.ok()) << code.status().to_string();
  const hal::DeviceAddr where = code->address();
  const uint64_t freed_before = rig.registry->stats().blocks_freed;

  Outcome o;
  {
    StreamGate gate(*rig.device, rig.stream);
    const LaunchArg args[] = {x.view(), out.view()};
    EXPECT_TRUE(rig.ctx->launch(rig.stream, *code, kBytes / kTileBytes, args).ok());
    EXPECT_TRUE(rig.registry->unregister(*code).ok());
    o.freed_while_queued = rig.registry->stats().blocks_freed - freed_before;
    StatusOr<exec::CodeHandle> replacement = rig.registry->register_image(*other);
    EXPECT_TRUE(replacement.ok());
    o.replacement_took_the_address = replacement->address() == where;
    gate.open();
    const Status s = rig.ctx->synchronize();
    o.output_is_the_copy = s.ok() && read_floats(*rig.ctx, out.view()) == xs;
    o.freed_after = rig.registry->stats().blocks_freed - freed_before;
  }
  return o;
}

TEST(HeldCode, AQueuedLaunchKeepsItsImageResidentUntilItRan) {
  const Outcome o = drop_the_handle_of_a_queued_launch(/*hold=*/true);
  EXPECT_EQ(o.freed_while_queued, 0u);
  EXPECT_FALSE(o.replacement_took_the_address);
  EXPECT_TRUE(o.output_is_the_copy);
  EXPECT_EQ(o.freed_after, 1u) << "the launch's hold is dropped once it completed";
}

// The check above can fail: without the hold, the block is freed at unregister, the
// next image lands on its address, and the queued launch runs that code instead.
TEST(HeldCode, WithoutTheHoldTheQueuedLaunchRunsOtherCode) {
  const Outcome o = drop_the_handle_of_a_queued_launch(/*hold=*/false);
  EXPECT_EQ(o.freed_while_queued, 1u);
  EXPECT_TRUE(o.replacement_took_the_address);
  EXPECT_FALSE(o.output_is_the_copy);
}

TEST(HeldCode, AnEmptyHandleIsRefusedByName) {
  MemoryRig rig;
  Buffer x = rig.buffer(kTileBytes, "x");
  Buffer out = rig.buffer(kTileBytes, "out");
  const LaunchArg args[] = {x.view(), out.view()};
  const Status s = rig.ctx->launch(rig.stream, exec::CodeHandle(), 1, args);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("code handle is empty"), std::string::npos) << s.to_string();
  EXPECT_TRUE(rig.launch(MemoryRig::kCopy, {x.view(), out.view()}).ok()) << "the context stays usable";
}

}  // namespace
}  // namespace npurt::testing
