// CodeRegistry on the simulated device: dedup by hash and bytes, one upload per
// distinct image, the publication epoch, and freeing on the last holder.
#include "exec/exec_factory.h"
#include "npurt/exec/code_registry.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <thread>
#include <vector>

#include "hal/sim_test_util.h"

namespace npurt::exec {
namespace {

using npurt::testing::contains;
using npurt::testing::elementwise_kernel;
using npurt::testing::make_sim;

isa::Image image(const char* name, isa::BinOp op) { return elementwise_kernel(name, op).value(); }

TEST(CodeRegistry, FirstRegistrationUploadsAndPublishes) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  EXPECT_EQ(reg.publication_epoch(), 0u);
  const isa::Image a = image("A", isa::BinOp::kAdd);

  auto h = reg.register_image(a);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_TRUE(h->valid());
  EXPECT_TRUE(h->address());
  EXPECT_EQ(h->name(), "A");
  EXPECT_EQ(h->bytes(), a.bytes().size());
  EXPECT_EQ(h->published_at(), 1u);
  EXPECT_EQ(h->use_count(), 1);
  EXPECT_EQ(reg.publication_epoch(), 1u);
  EXPECT_EQ(dev->counters().code_uploads, 1u);
  EXPECT_EQ(dev->counters().code_upload_bytes, a.bytes().size());

  const CodeRegistryStats s = reg.stats();
  EXPECT_EQ(s.publications, 1u);
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_EQ(s.dedup_hits, 0u);
  EXPECT_EQ(s.live_images, 1u);
  EXPECT_EQ(s.published_bytes, a.bytes().size());
}

TEST(CodeRegistry, HashIsXxh3Of128BitsOverTheImageBytes) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  const isa::Image a = image("A", isa::BinOp::kAdd);
  auto h = reg.register_image(a);
  ASSERT_TRUE(h.ok());
  const XXH128_hash_t want = XXH3_128bits(a.bytes().data(), a.bytes().size());
  EXPECT_EQ(h->hash().lo, want.low64);
  EXPECT_EQ(h->hash().hi, want.high64);
  EXPECT_EQ(hash_code(a.bytes()), h->hash());
}

TEST(CodeRegistry, DedupHitBumpsTheRefcountAndWritesNothing) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  auto first = reg.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(first.ok());
  const hal::Counters before = dev->counters();

  // A separately built image with the same bytes.
  auto second = reg.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(second->address(), first->address());
  EXPECT_EQ(first->use_count(), 2);

  const hal::Counters d = dev->counters() - before;
  EXPECT_EQ(d.code_uploads, 0u) << "a dedup hit must not upload";
  EXPECT_EQ(d.h2d_transfers, 0u);
  EXPECT_EQ(reg.publication_epoch(), 1u) << "a dedup hit must not publish";
  const CodeRegistryStats s = reg.stats();
  EXPECT_EQ(s.dedup_hits, 1u);
  EXPECT_EQ(s.publications, 1u);
  EXPECT_EQ(s.registrations, 2u);
  EXPECT_EQ(s.live_images, 1u);
}

TEST(CodeRegistry, DistinctImagesGetDistinctBlocksAndPublications) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  auto a = reg.register_image(image("A", isa::BinOp::kAdd));
  auto b = reg.register_image(image("B", isa::BinOp::kMul));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->address(), b->address());
  EXPECT_FALSE(*a == *b);
  EXPECT_EQ(reg.publication_epoch(), 2u);
  EXPECT_EQ(b->published_at(), 2u);
  EXPECT_EQ(dev->counters().code_uploads, 2u);
  EXPECT_EQ(reg.stats().live_images, 2u);
}

// Never trust a hash alone for code: with every image hashing alike, different bytes
// still get their own block, and identical bytes still dedup.
TEST(CodeRegistry, EqualHashWithDifferentBytesIsADifferentImage) {
  auto dev = make_sim();
  CodeRegistryOptions o;
  o.hash = [](std::span<const uint8_t>) { return CodeHash{42, 42}; };
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev, o);
  auto a = reg.register_image(image("A", isa::BinOp::kAdd));
  auto b = reg.register_image(image("B", isa::BinOp::kMul));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->address(), b->address()) << "B must not be served A's code";
  EXPECT_EQ(reg.stats().hash_collisions, 1u);
  EXPECT_EQ(reg.publication_epoch(), 2u);

  auto b2 = reg.register_image(image("B", isa::BinOp::kMul));
  ASSERT_TRUE(b2.ok());
  EXPECT_EQ(*b2, *b);
  EXPECT_EQ(reg.stats().dedup_hits, 1u);
  EXPECT_EQ(reg.publication_epoch(), 2u);
}

TEST(CodeRegistry, BlockIsFreedWhenTheLastHolderGoesAndItsAddressRecycled) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  auto r1 = reg.register_image(image("A", isa::BinOp::kAdd));
  auto r2 = reg.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(r1.ok() && r2.ok());
  const hal::DeviceAddr addr = r1->address();
  CodeHandle copy = *r1;  // e.g. what an in-flight run holds
  EXPECT_EQ(r1->use_count(), 3);

  NPURT_ASSERT_OK(reg.unregister(*r1));
  EXPECT_FALSE(r1->valid());
  NPURT_ASSERT_OK(reg.unregister(*r2));
  EXPECT_EQ(reg.stats().blocks_freed, 0u) << "a holder remains";
  EXPECT_EQ(reg.stats().live_images, 1u);

  copy.reset();
  EXPECT_EQ(reg.stats().blocks_freed, 1u);
  EXPECT_EQ(reg.stats().live_images, 0u);

  // B, laid out like A, lands at A's recycled address: a real publication.
  auto b = reg.register_image(image("B", isa::BinOp::kMul));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->address(), addr);
  EXPECT_EQ(reg.publication_epoch(), 2u);

  // A again is not a dedup hit any more: it is published anew.
  auto a_again = reg.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(a_again.ok());
  EXPECT_EQ(reg.stats().dedup_hits, 1u);  // only r2's
  EXPECT_EQ(reg.publication_epoch(), 3u);
}

TEST(CodeRegistry, UnregisterRejectsEmptyAndForeignHandles) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev), other(npurt::testing::ExecFactory::key(), dev);
  CodeHandle empty;
  Status st = reg.unregister(empty);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.to_string();
  EXPECT_TRUE(contains(st, "empty")) << st.to_string();

  auto h = reg.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(h.ok());
  NPURT_ASSERT_OK(reg.unregister(*h));
  st = reg.unregister(*h);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << "use after unregister: " << st.to_string();

  auto foreign = other.register_image(image("A", isa::BinOp::kAdd));
  ASSERT_TRUE(foreign.ok());
  st = reg.unregister(*foreign);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_TRUE(contains(st, "another code registry")) << st.to_string();
  EXPECT_TRUE(foreign->valid()) << "a rejected unregister leaves the handle alone";
}

TEST(CodeRegistry, HandlesMayOutliveTheRegistry) {
  auto dev = make_sim();
  CodeHandle h;
  {
    CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
    auto r = reg.register_image(image("A", isa::BinOp::kAdd));
    ASSERT_TRUE(r.ok());
    h = *r;
  }
  const hal::DeviceAddr addr = h.address();
  const uint64_t size = h.bytes();
  h.reset();
  // The block went back to the allocator.
  auto again = dev->allocate(size);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, addr);
}

TEST(CodeRegistry, AllocationFailureIsAnErrorNamingTheImageAndLeavesNothing) {
  hal::SimOptions o;
  o.global_memory_bytes = 1u << 20;
  auto dev = make_sim(o);
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  isa::KernelBuilder b("huge");
  b.add_constants(std::vector<uint8_t>(2u << 20, 1));
  b.exit();
  auto big = b.build();
  ASSERT_TRUE(big.ok()) << big.status().to_string();
  auto h = reg.register_image(*big);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().to_string();
  EXPECT_TRUE(contains(h.status(), "register_image 'huge'")) << h.status().to_string();
  EXPECT_EQ(reg.publication_epoch(), 0u);
  EXPECT_EQ(reg.stats().live_images, 0u);
  EXPECT_EQ(dev->counters().code_uploads, 0u);
}

// Many threads registering and dropping the same few images: each distinct image
// resident at most once at a time, and every block freed in the end.
TEST(CodeRegistry, ConcurrentRegisterAndUnregisterStayConsistent) {
  auto dev = make_sim();
  CodeRegistry reg(npurt::testing::ExecFactory::key(), dev);
  const std::vector<isa::Image> images = {image("A", isa::BinOp::kAdd), image("B", isa::BinOp::kMul),
                                          image("C", isa::BinOp::kSub), image("D", isa::BinOp::kMax)};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<CodeHandle> held;
      for (int i = 0; i < 300; ++i) {
        auto h = reg.register_image(images[(i + t) % images.size()]);
        if (!h.ok()) {
          ++errors;
          continue;
        }
        held.push_back(*h);
        if (held.size() > 3) held.erase(held.begin());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  const CodeRegistryStats s = reg.stats();
  EXPECT_EQ(s.registrations, 1200u);
  EXPECT_EQ(s.publications + s.dedup_hits, 1200u);
  EXPECT_EQ(s.live_images, 0u);
  EXPECT_EQ(s.blocks_freed, s.publications);
  EXPECT_EQ(s.free_failures, 0u);
  EXPECT_EQ(dev->counters().code_uploads, s.publications);
}

}  // namespace
}  // namespace npurt::exec
