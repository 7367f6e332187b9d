#include "backends/cuda/cold_chunks.h"

#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace cuda_backend {
namespace {

std::vector<ColdChunk> Plan(const std::vector<int>& pages, int capacity) {
  std::vector<ColdChunk> chunks = {ColdChunk{}};  // cleared by the call
  PlanColdChunks(pages, capacity, &chunks);
  return chunks;
}

TEST(ColdChunks, FitsInOne) {
  std::vector<ColdChunk> c = Plan({3, 0, 5}, 8);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(c[0].levels);
  EXPECT_EQ(c[0].first_item, 0);
  EXPECT_EQ(c[0].items, 3);
  EXPECT_EQ(c[0].first_page, 0);
  EXPECT_EQ(c[0].pages, 8);
  EXPECT_EQ(c[0].max_pages, 5);
}

TEST(ColdChunks, CutWhereTheScratchIsFull) {
  std::vector<ColdChunk> c = Plan({4, 4, 1, 4}, 8);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].items, 2);
  EXPECT_EQ(c[0].pages, 8);
  EXPECT_EQ(c[1].first_item, 2);
  EXPECT_EQ(c[1].first_page, 8);
  EXPECT_EQ(c[1].items, 2);
  EXPECT_EQ(c[1].pages, 5);
  EXPECT_EQ(c[1].max_pages, 4);
}

TEST(ColdChunks, ItemsLargerThanTheScratchGoFused) {
  std::vector<ColdChunk> c = Plan({2, 9, 12, 3, 3, 10}, 8);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_TRUE(c[0].levels);
  EXPECT_EQ(c[0].items, 1);
  EXPECT_FALSE(c[1].levels);  // 9 and 12 together
  EXPECT_EQ(c[1].first_item, 1);
  EXPECT_EQ(c[1].items, 2);
  EXPECT_EQ(c[1].first_page, 2);
  EXPECT_EQ(c[1].pages, 21);
  EXPECT_EQ(c[1].max_pages, 12);
  EXPECT_TRUE(c[2].levels);
  EXPECT_EQ(c[2].first_page, 23);
  EXPECT_EQ(c[2].pages, 6);
  EXPECT_FALSE(c[3].levels);
  EXPECT_EQ(c[3].first_item, 5);
  EXPECT_EQ(c[3].first_page, 29);
}

TEST(ColdChunks, NoScratchIsOneFusedChunk) {
  std::vector<ColdChunk> c = Plan({1, 2, 3}, 0);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_FALSE(c[0].levels);
  EXPECT_EQ(c[0].items, 3);
  EXPECT_EQ(c[0].pages, 6);
  EXPECT_TRUE(Plan({}, 8).empty());
}

// Every item keeps its route whatever its neighbours: the same item alone
// and in a batch takes the same kernel.
TEST(ColdChunks, RouteIsTheItemsOwn) {
  const std::vector<int> pages = {7, 1, 8, 9, 0, 5, 16, 2};
  std::vector<ColdChunk> c = Plan(pages, 8);
  int item = 0, page = 0;
  for (const ColdChunk& k : c) {
    EXPECT_EQ(k.first_item, item);
    EXPECT_EQ(k.first_page, page);
    EXPECT_LE(k.levels ? k.pages : 0, 8);
    for (int i = k.first_item; i < k.first_item + k.items; ++i) {
      EXPECT_EQ(k.levels, pages[i] <= 8) << "item " << i;
      EXPECT_EQ(Plan({pages[i]}, 8)[0].levels, k.levels) << "item " << i << " alone";
    }
    item += k.items;
    page += k.pages;
  }
  EXPECT_EQ(item, static_cast<int>(pages.size()));
}

}  // namespace
}  // namespace cuda_backend
}  // namespace driftkv
