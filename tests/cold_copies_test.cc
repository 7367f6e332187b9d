// ColdCopies (service/cold_copies.h): what it holds, what it gives back
// and to whom, on a bare pool of opaque pages.
#include "service/cold_copies.h"

#include <memory>
#include <vector>

#include "backends/page_pool.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

constexpr size_t kPageBytes = 64;

std::unique_ptr<PagePool> Pool(int pages, int partitions = 1) {
  return *PagePool::CreateOpaque(kPageBytes, 128, pages * kPageBytes, partitions);
}

std::vector<int32_t> Refs(const PagePool& pool, const std::vector<PageId>& pages) {
  std::vector<int32_t> out;
  for (PageId p : pages) out.push_back(pool.references(p));
  return out;
}

TEST(ColdCopies, KeepsTakesAndDropsTheCallersReferences) {
  auto pool = Pool(8);
  ColdCopies copies(*pool);
  const std::vector<PageId> a = *pool->Reserve(3), b = *pool->Reserve(2);
  copies.Keep(1, a);
  copies.Keep(2, b);
  EXPECT_EQ(copies.pages(), 5);
  EXPECT_EQ(copies.layers(), 2u);
  EXPECT_EQ(pool->pages_in_use(), 5);
  EXPECT_EQ(copies.Take(1), a);  // in order, references to the caller
  EXPECT_EQ(Refs(*pool, a), std::vector<int32_t>({1, 1, 1}));
  EXPECT_TRUE(copies.Take(1).empty());
  EXPECT_EQ(copies.pages(), 2);
  copies.Drop(2);
  copies.Drop(2);  // nothing left: no effect
  EXPECT_EQ(copies.pages(), 0);
  EXPECT_EQ(pool->pages_in_use(), 3);  // a's, held by the caller now
  pool->Free(a);
  EXPECT_EQ(pool->pages_in_use(), 0);
}

TEST(ColdCopies, KeepingALayerAgainFreesItsEarlierCopies) {
  auto pool = Pool(8);
  ColdCopies copies(*pool);
  copies.Keep(7, *pool->Reserve(3));
  const std::vector<PageId> now = *pool->Reserve(2);
  copies.Keep(7, now);
  EXPECT_EQ(copies.pages(), 2);
  EXPECT_EQ(pool->pages_in_use(), 2);
  EXPECT_EQ(copies.Take(7), now);
  pool->Free(now);
}

TEST(ColdCopies, ReclaimFreesTheLongestKeptOfThePartitionFirst) {
  auto pool = Pool(8, 2);  // 4 pages a partition
  ColdCopies copies(*pool);
  copies.Keep(1, *pool->Reserve(1, 0));
  copies.Keep(2, *pool->Reserve(2, 1));
  copies.Keep(3, *pool->Reserve(2, 0));
  copies.Keep(4, *pool->Reserve(1, 0));
  EXPECT_EQ(copies.pages(0), 4);
  EXPECT_EQ(copies.pages(1), 2);
  // Two pages of partition 0: layer 1's (1 page), then layer 3's (2).
  int64_t dropped = 0;
  EXPECT_EQ(copies.Reclaim(2, 0, &dropped), 3);
  EXPECT_EQ(dropped, 3);
  EXPECT_TRUE(copies.Take(1).empty());
  EXPECT_TRUE(copies.Take(3).empty());
  EXPECT_EQ(copies.pages(0), 1);
  EXPECT_EQ(copies.pages(1), 2);  // the other partition's untouched
  EXPECT_EQ(pool->pages_in_use(0), 1);
  // More than there is: all of partition 0's, and what it freed.
  EXPECT_EQ(copies.Reclaim(10, 0), 1);
  EXPECT_EQ(copies.Reclaim(1, 0), 0);
  EXPECT_EQ(copies.pages(), 2);
}

TEST(ColdCopies, ASharedPageLosesOnlyTheCopysReference) {
  auto pool = Pool(4);
  ColdCopies copies(*pool);
  const std::vector<PageId> pages = *pool->Reserve(2);
  pool->Retain({pages[0]});  // another holder of the first (a fork)
  copies.Keep(1, pages);
  EXPECT_EQ(copies.pages(), 1);  // the second only: the first stays in use without the copy
  // Both pages' copy references go; only the second page becomes free.
  int64_t dropped = 0;
  EXPECT_EQ(copies.Reclaim(2, 0, &dropped), 1);
  EXPECT_EQ(dropped, 2);
  EXPECT_EQ(copies.pages(), 0);
  EXPECT_EQ(Refs(*pool, pages), std::vector<int32_t>({1, 0}));
  pool->Free({pages[0]});
}

TEST(ColdCopies, ExtendAppendsOnlyWhereTheCopiesEnd) {
  auto pool = Pool(8);
  ColdCopies copies(*pool);
  const std::vector<PageId> first = *pool->Reserve(2), next = *pool->Reserve(1), stray = *pool->Reserve(1);
  copies.Keep(1, first);
  EXPECT_TRUE(copies.Extend(1, 2, next));                // pages 2.. of the layer follow 0, 1
  EXPECT_FALSE(copies.Extend(1, 5, stray));              // a gap: freed
  EXPECT_FALSE(copies.Extend(9, 0, *pool->Reserve(1)));  // no copies: freed
  EXPECT_EQ(copies.pages(), 3);
  EXPECT_EQ(pool->pages_in_use(), 3);
  EXPECT_EQ(copies.Take(1), std::vector<PageId>({first[0], first[1], next[0]}));
  pool->Free({first[0], first[1], next[0]});
}

TEST(ColdCopies, AsThePoolsReclaimerTheyMakeRoomForAReserve) {
  auto pool = Pool(4);
  ColdCopies copies(*pool);
  pool->SetReclaimer([&](int64_t pages, int partition) { copies.Reclaim(pages, partition); });
  copies.Keep(1, *pool->Reserve(3));
  const absl::StatusOr<std::vector<PageId>> more = pool->Reserve(3);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(copies.pages(), 0);
  // With nothing left to reclaim, the pool's own refusal.
  EXPECT_EQ(pool->Reserve(2).status().code(), absl::StatusCode::kResourceExhausted);
  pool->SetReclaimer(nullptr);
  pool->Free(*more);
}

TEST(ColdCopies, GivesEveryReferenceBackWhenDestroyed) {
  auto pool = Pool(4);
  {
    ColdCopies copies(*pool);
    copies.Keep(1, *pool->Reserve(2));
    copies.Keep(2, *pool->Reserve(2));
  }
  EXPECT_EQ(pool->pages_in_use(), 0);
}

}  // namespace
}  // namespace driftkv
