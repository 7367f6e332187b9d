// THE page layout (codec/page_layout.h): what the pool, the CUDA backend,
// the GPU tests and bench_gpu all use. Offsets as documented, the same
// bytes as before the layout had one definition (the service's pages), and
// every shape the GPU kernels take satisfies their requirements with it.
// Also the pool's reference counts (backends/page_pool.h, REFERENCES).
#include "codec/page_layout.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "backends/page_pool.h"
#include "codec/dquant_codec.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"

namespace driftkv {
namespace {

DQuantCodec Codec(int kv_heads, int head_dim, int mean_window = 128) {
  DQuantConfig c;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.mean_window = mean_window;
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return *std::move(codec);
}

TEST(PageLayout, OffsetsAsDocumented) {
  const DQuantCodec codec = Codec(4, 128);  // n = 512: records of 168, 120 and 516 bytes
  const PageLayout l = codec.page_layout();
  EXPECT_EQ(l.page_tokens, 128);
  EXPECT_EQ(l.key_stride, 168);
  EXPECT_EQ(l.value_stride, 120);
  EXPECT_EQ(l.mean_stride, 516);
  EXPECT_EQ(l.value_offset, 128u * 168);
  EXPECT_EQ(l.mean_offset, 128u * (168 + 120));
  // The service's page stride since its first version: the end of the mean
  // record rounded up to 64 bytes.
  EXPECT_EQ(l.page_bytes, (128u * 288 + 516 + 63) / 64 * 64);
  EXPECT_EQ(l.key_record(5), 5u * 168);
  EXPECT_EQ(l.value_record(5), l.value_offset + 5u * 120);
}

TEST(PageLayout, PoolUsesIt) {
  const DQuantCodec codec = Codec(2, 64, 32);
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(codec.page_layout(), 1 << 20);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const PageLayout& l = (*pool)->layout();
  EXPECT_EQ((*pool)->page_stride(), l.page_bytes);
  EXPECT_EQ((*pool)->value_records(3) - (*pool)->key_records(3), static_cast<ptrdiff_t>(l.value_offset));
  EXPECT_EQ((*pool)->mean_record(3) - (*pool)->key_records(3), static_cast<ptrdiff_t>(l.mean_offset));
  EXPECT_EQ((*pool)->key_records(3) - (*pool)->key_records(0), static_cast<ptrdiff_t>(3 * l.page_bytes));
}

TEST(PageLayout, EveryGpuShapeIsTakenByTheKernels) {
  for (int kv_heads : {1, 2, 4, 8}) {
    for (int head_dim : {64, 128}) {
      const PageLayout l = Codec(kv_heads, head_dim).page_layout();
      EXPECT_EQ(gpu::GpuPageLayoutError(l, gpu::PageUse::kEncode), "") << kv_heads << " x " << head_dim;
      EXPECT_EQ(l.value_offset % 16, 0u);
      EXPECT_EQ(l.mean_offset % 16, 0u);
      // Attention: every shape but n = 64, whose 68-byte mean record cannot
      // absorb the read-ahead (the CUDA backend has always refused it).
      if (kv_heads * head_dim > 64) {
        EXPECT_EQ(gpu::GpuPageLayoutError(l, gpu::PageUse::kAttend), "") << kv_heads << " x " << head_dim;
        EXPECT_GE(l.mean_stride, kGpuReadAheadBytes);
      } else {
        EXPECT_NE(gpu::GpuPageLayoutError(l, gpu::PageUse::kAttend), "");
      }
    }
  }
  EXPECT_TRUE(absl::StrContains(gpu::GpuPageLayoutError(Codec(2, 64, 64).page_layout(), gpu::PageUse::kEncode),
                                "pages of 64 tokens"));
}

// A pool of `pages` opaque pages of 64 bytes in `partitions` partitions.
std::unique_ptr<PagePool> SmallPool(int pages, int partitions = 1) {
  PageLayout l;
  l.page_tokens = 16;
  l.page_bytes = 64;
  absl::StatusOr<std::unique_ptr<PagePool>> pool = PagePool::Create(l, 64u * pages, partitions);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return *std::move(pool);
}

TEST(PagePoolReferences, ReserveGivesOneAndFreeReturnsAtZero) {
  std::unique_ptr<PagePool> pool = SmallPool(4);
  std::vector<PageId> a = *pool->Reserve(2);
  for (PageId p : a) EXPECT_EQ(pool->references(p), 1);
  pool->Retain(a);
  for (PageId p : a) EXPECT_EQ(pool->references(p), 2);
  EXPECT_EQ(pool->pages_in_use(), 2);  // distinct pages, not references
  pool->Free(a);
  for (PageId p : a) EXPECT_EQ(pool->references(p), 1);
  EXPECT_EQ(pool->pages_in_use(), 2);
  // A page still held is never handed out again: only the 2 free ones.
  EXPECT_TRUE(absl::IsResourceExhausted(pool->Reserve(3).status()));
  std::vector<PageId> b = *pool->Reserve(2);
  for (PageId p : b) EXPECT_EQ(std::count(a.begin(), a.end(), p), 0);
  pool->Free(a);
  for (PageId p : a) EXPECT_EQ(pool->references(p), 0);
  EXPECT_EQ(pool->pages_in_use(), 2);
  pool->Free(b);
  EXPECT_EQ(pool->pages_in_use(), 0);
  // Recycled pages start again at one reference.
  std::vector<PageId> c = *pool->Reserve(4);
  for (PageId p : c) EXPECT_EQ(pool->references(p), 1);
}

TEST(PagePoolReferences, WithoutRetainTheFreeListIsAsBefore) {
  // LIFO: the most recently freed page is the next one handed out.
  std::unique_ptr<PagePool> pool = SmallPool(3);
  std::vector<PageId> a = *pool->Reserve(3);
  pool->Free({a[1]});
  EXPECT_EQ(*pool->Reserve(1), std::vector<PageId>{a[1]});
}

TEST(PagePoolReferences, RepeatedPageTakesOneReferencePerAppearance) {
  std::unique_ptr<PagePool> pool = SmallPool(2);
  const PageId p = (*pool->Reserve(1))[0];
  pool->Retain({p, p});
  EXPECT_EQ(pool->references(p), 3);
  pool->Free({p, p, p});
  EXPECT_EQ(pool->references(p), 0);
  EXPECT_EQ(pool->pages_in_use(), 0);
}

TEST(PagePoolReferences, SharedPageGoesBackToItsPartition) {
  std::unique_ptr<PagePool> pool = SmallPool(8, 2);
  const PageId p = (*pool->Reserve(1, 1))[0];
  EXPECT_EQ(pool->partition_of(p), 1);
  pool->Retain({p});
  pool->Free({p});
  EXPECT_EQ(pool->pages_in_use(1), 1);
  pool->Free({p});
  EXPECT_EQ(pool->pages_in_use(1), 0);
  EXPECT_EQ(pool->pages_in_use(0), 0);
  // All four pages of partition 1 can be had again, none of partition 0's.
  std::vector<PageId> all = *pool->Reserve(4, 1);
  for (PageId q : all) EXPECT_EQ(pool->partition_of(q), 1);
}

TEST(PagePoolReferences, ConcurrentRetainAndFreeBalance) {
  std::unique_ptr<PagePool> pool = SmallPool(64);
  const std::vector<PageId> shared = *pool->Reserve(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        pool->Retain(shared);
        std::vector<PageId> own = *pool->Reserve(2);  // others' churn beside the shared pages
        pool->Free(shared);
        pool->Free(own);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (PageId p : shared) EXPECT_EQ(pool->references(p), 1);
  EXPECT_EQ(pool->pages_in_use(), 16);
  pool->Free(shared);
  EXPECT_EQ(pool->pages_in_use(), 0);
}

}  // namespace
}  // namespace driftkv
