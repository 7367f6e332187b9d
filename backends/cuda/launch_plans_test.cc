// Which launch plans the CUDA backend may reuse: only those made from jobs
// equal in every field that goes into a plan and in every page id.
#include "backends/cuda/launch_plans.h"

#include <cstdint>
#include <functional>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace cuda_backend {
namespace {

// A decode loop's request: `items` jobs, each with its own pages, window
// and client tensors.
struct Request {
  Request(int items, int n_pages, int seed) : pages(items), jobs(items), query(items), out(items) {
    for (int i = 0; i < items; ++i) {
      for (int k = 0; k < n_pages; ++k) pages[i].push_back(seed * 100000 + i * 1000 + k);
      AttendJob& j = jobs[i];
      j.pages = pages[i];
      j.window.tokens = 17 + i;
      j.window_id = static_cast<uint64_t>(seed) * 1000 + i + 1;
      j.window_first = 128 * n_pages;
      j.query_dev = &query[i];
      j.query_dtype = 1;
      j.out_dev = &out[i];
      j.out_dtype = 1;
      j.lse_dev = &out[i];
      j.q_heads = 32;
      j.layer = seed % 32;
      j.hot = true;
      j.check_query = true;
    }
  }
  std::vector<std::vector<PageId>> pages;
  std::vector<AttendJob> jobs;
  std::vector<float> query, out;
};

TEST(LaunchPlansTest, FindsOnlyARecordedPlanOfEqualJobs) {
  LaunchPlans plans(8);
  Request r(64, 64, 1);
  EXPECT_EQ(plans.Find(r.jobs), -1);
  const int e = plans.Record(r.jobs);
  ASSERT_GE(e, 0);
  EXPECT_EQ(plans.Find(r.jobs), e);
  EXPECT_EQ(plans.Find(r.jobs), e);
  EXPECT_EQ(plans.hits(), 2u);
  EXPECT_EQ(plans.records(), 1u);
  // The same jobs built again (other addresses for the page lists) are
  // the same plan: it holds page ids, not where the handler keeps them.
  Request again(64, 64, 1);
  for (int i = 0; i < 64; ++i) {
    again.jobs[i].query_dev = r.jobs[i].query_dev;
    again.jobs[i].out_dev = r.jobs[i].out_dev;
    again.jobs[i].lse_dev = r.jobs[i].lse_dev;
  }
  EXPECT_EQ(plans.Find(again.jobs), e);
}

TEST(LaunchPlansTest, AnyChangeOfAJobIsAnotherPlan) {
  const std::vector<std::pair<const char*, std::function<void(Request*)>>> changes = {
      {"a page id, in place", [](Request* r) { r->pages[5][63] += 1; }},
      {"the first page id", [](Request* r) { r->pages[0][0] = 7; }},
      {"a page sealed",
       [](Request* r) {
         r->pages[9].push_back(424242);
         r->jobs[9].pages = r->pages[9];
       }},
      {"a page fewer", [](Request* r) { r->jobs[3].pages = absl::MakeConstSpan(r->pages[3]).subspan(1); }},
      {"a window token more", [](Request* r) { r->jobs[63].window.tokens += 1; }},
      {"the window's first token", [](Request* r) { r->jobs[2].window_first += 128; }},
      {"another window", [](Request* r) { r->jobs[2].window_id += 99999; }},
      {"the layer", [](Request* r) { r->jobs[7].layer += 1; }},
      {"the query's address", [](Request* r) { r->jobs[1].query_dev = &r->out[0]; }},
      {"the query's dtype", [](Request* r) { r->jobs[1].query_dtype = 3; }},
      {"the output's address", [](Request* r) { r->jobs[4].out_dev = nullptr; }},
      {"the output's dtype", [](Request* r) { r->jobs[4].out_dtype = 3; }},
      {"the lse's address", [](Request* r) { r->jobs[4].lse_dev = &r->query[4]; }},
      {"the query check", [](Request* r) { r->jobs[0].check_query = false; }},
      {"the tier", [](Request* r) { r->jobs[0].hot = false; }},
      {"q_heads", [](Request* r) { r->jobs[0].q_heads = 16; }},
      {"an item fewer", [](Request* r) { r->jobs.pop_back(); }},
      {"two items swapped", [](Request* r) { std::swap(r->jobs[10], r->jobs[11]); }},
  };
  for (const auto& [what, change] : changes) {
    LaunchPlans plans(8);
    Request r(64, 64, 2);
    const int e = plans.Record(r.jobs);
    ASSERT_EQ(plans.Find(r.jobs), e) << what;
    change(&r);
    EXPECT_EQ(plans.Find(r.jobs), -1) << what;
    // Recorded anew, the changed jobs take the entry their key names or
    // another one; either way they are found and are the plan.
    const int e2 = plans.Record(r.jobs);
    ASSERT_GE(e2, 0) << what;
    EXPECT_EQ(plans.Find(r.jobs), e2) << what;
  }
}

TEST(LaunchPlansTest, ARecordOfTheSameJobsReplacesTheirEntry) {
  LaunchPlans plans(4);
  Request r(8, 16, 3);
  const int e = plans.Record(r.jobs);
  r.pages[0][0] = -5;  // same key (fields), other pages
  EXPECT_EQ(plans.Find(r.jobs), -1);
  EXPECT_EQ(plans.Record(r.jobs), e);
  EXPECT_EQ(plans.Find(r.jobs), e);
}

TEST(LaunchPlansTest, TheLeastRecentlyUsedPlanMakesRoom) {
  LaunchPlans plans(4);
  std::vector<Request> layers;
  for (int l = 0; l < 5; ++l) layers.emplace_back(16, 8, 10 + l);
  std::vector<int> entry;
  for (int l = 0; l < 4; ++l) entry.push_back(plans.Record(layers[l].jobs));
  for (int l = 0; l < 4; ++l) {
    for (int m = l + 1; m < 4; ++m) EXPECT_NE(entry[l], entry[m]);
  }
  EXPECT_EQ(plans.Find(layers[0].jobs), entry[0]);  // layer 1 is now the oldest
  EXPECT_EQ(plans.Record(layers[4].jobs), entry[1]);
  EXPECT_EQ(plans.Find(layers[1].jobs), -1);
  EXPECT_EQ(plans.Find(layers[0].jobs), entry[0]);
  EXPECT_EQ(plans.Find(layers[2].jobs), entry[2]);
  EXPECT_EQ(plans.Find(layers[3].jobs), entry[3]);
  EXPECT_EQ(plans.Find(layers[4].jobs), entry[1]);
}

TEST(LaunchPlansTest, ClearAndNoCapacity) {
  LaunchPlans plans(4);
  Request a(4, 4, 20), b(4, 4, 21);
  const int ea = plans.Record(a.jobs), eb = plans.Record(b.jobs);
  EXPECT_EQ(plans.Find(a.jobs), ea);
  EXPECT_EQ(plans.Find(b.jobs), eb);
  plans.Clear();
  EXPECT_EQ(plans.Find(a.jobs), -1);
  EXPECT_EQ(plans.Find(b.jobs), -1);
  LaunchPlans none(0);
  EXPECT_EQ(none.Record(a.jobs), -1);
  EXPECT_EQ(none.Find(a.jobs), -1);
}

}  // namespace
}  // namespace cuda_backend
}  // namespace driftkv
