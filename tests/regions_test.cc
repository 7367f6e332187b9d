// RegionTable without a network (service/regions.h): tenants kept apart
// with indistinguishable NOT_FOUND, range and alignment checks (64-bit
// overflow included), leases on a fake clock, attach tokens single-use and
// short-lived, quotas, drain, and a region unregistered while in use
// staying mapped until its last view is dropped. A fake backend stands in
// for pinning and CUDA IPC (the GPU path: backends/cuda/ipc_regions.h,
// tests/regions_gpu_test.cc).
#include "service/regions.h"

#include <sys/mman.h>

#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;

// Counts pins and IPC opens; "opens" an IPC handle as a host buffer.
class FakeBackend : public Backend {
 public:
  std::string name() const override { return "fake"; }
  absl::Status EncodePages(absl::Span<EncodeJob>) override { return absl::OkStatus(); }
  absl::Status DecodeTokens(PageId, int, int, int, float*, float*) override { return absl::OkStatus(); }
  void Attend(absl::Span<AttendJob>) override {}
  absl::StatusOr<void*> OpenIpcRegion(const void*, size_t, int device, size_t size) override {
    if (device != 0) return absl::InvalidArgumentError(absl::StrCat("device ", device, " out of range [0, 1)"));
    ++opened;
    return static_cast<void*>(new char[size]);
  }
  void CloseIpcRegion(void* p) override {
    ++closed;
    delete[] static_cast<char*>(p);
  }
  absl::Status PinHostRegion(void*, size_t) override {
    ++pinned;
    return absl::OkStatus();
  }
  void UnpinHostRegion(void*) override { ++unpinned; }
  int opened = 0, closed = 0, pinned = 0, unpinned = 0;
};

class RegionsTest : public ::testing::Test {
 protected:
  RegionsTest() {
    options_.max_region_bytes = 1 << 20;
    options_.max_region_bytes_per_tenant = 3 << 20;
    options_.max_regions = 4;
    options_.region_lease_seconds = 10;
    options_.max_region_lease_seconds = 100;
    table_ = std::make_unique<RegionTable>(options_, &backend_, nullptr, [this] { return now_; });
  }
  // A host region of `bytes` for `tenant`, through a pending attachment.
  uint64_t Host(const std::string& tenant, uint64_t bytes, uint32_t lease = 0) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    absl::StatusOr<std::string> token = table_->AddPending(p, bytes, {});
    EXPECT_TRUE(token.ok()) << token.status();
    v1::RegisterRegionRequest r;
    r.set_kind(v1::REGION_HOST_SHM);
    r.set_attach_token(*token);
    r.set_lease_seconds(lease);
    v1::RegisterRegionResponse out;
    absl::Status st = table_->Register(r, &out, tenant);
    EXPECT_TRUE(st.ok()) << st;
    return out.region_id();
  }
  static v1::TensorRef Ref(uint64_t id, uint64_t offset) {
    v1::TensorRef ref;
    ref.set_region_id(id);
    ref.set_offset(offset);
    return ref;
  }

  ServiceOptions options_;
  FakeBackend backend_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::unique_ptr<RegionTable> table_;
};

TEST_F(RegionsTest, ResolveGivesTheRegionsMemoryAndChecksRangeAndAlignment) {
  const uint64_t id = Host("alice", 4096);
  EXPECT_NE(id, 0u);
  absl::StatusOr<RegionView> v = table_->Resolve("alice", Ref(id, 4096 - 16), 16, 4, "items[0].query_ref");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->space, MemorySpace::kHost);
  EXPECT_EQ(v->device, -1);
  absl::StatusOr<RegionView> first = table_->Resolve("alice", Ref(id, 0), 4096, 4, "f");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(static_cast<char*>(v->data) - static_cast<char*>(first->data), 4096 - 16);

  absl::Status past = table_->Resolve("alice", Ref(id, 4096 - 12), 16, 4, "items[3].output_ref").status();
  EXPECT_EQ(past.code(), C::kOutOfRange);
  EXPECT_EQ(past.message(),
            absl::StrCat("items[3].output_ref.offset 4084 + 16 bytes is past the end of region ", id, " (4096 bytes)"));
  // offset + bytes overflowing 64 bits is past the end too, not a wrap.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(table_->Resolve("alice", Ref(id, max - 7), 16, 4, "f").status().code(), C::kOutOfRange);
  EXPECT_EQ(table_->Resolve("alice", Ref(id, 8), max - 4, 4, "f").status().code(), C::kOutOfRange);
  EXPECT_EQ(table_->Resolve("alice", Ref(id, 4097), 0, 1, "f").status().code(), C::kOutOfRange);

  absl::Status odd = table_->Resolve("alice", Ref(id, 6), 16, 4, "items[1].lse_ref").status();
  EXPECT_EQ(odd.code(), C::kInvalidArgument);
  EXPECT_EQ(odd.message(), "items[1].lse_ref.offset 6 is not a multiple of 4");
  EXPECT_TRUE(table_->Resolve("alice", Ref(id, 6), 16, 2, "bf16").ok());
}

TEST_F(RegionsTest, AnotherTenantSeesExactlyWhatAnUnknownIdGives) {
  const uint64_t id = Host("alice", 4096);
  absl::Status foreign = table_->Resolve("bob", Ref(id, 0), 4, 4, "items[3].query_ref").status();
  EXPECT_EQ(foreign.code(), C::kNotFound);
  EXPECT_EQ(foreign.message(), absl::StrCat("items[3].query_ref.region_id ", id, " not found"));
  const uint64_t unknown = id ^ 1;
  absl::Status missing = table_->Resolve("alice", Ref(unknown, 0), 4, 4, "items[3].query_ref").status();
  EXPECT_EQ(missing.code(), C::kNotFound);
  EXPECT_EQ(missing.message(), absl::StrCat("items[3].query_ref.region_id ", unknown, " not found"));

  // Bob can neither unregister nor renew it; the answers are those of an
  // unknown id.
  v1::UnregisterRegionRequest u;
  u.set_region_id(id);
  absl::Status st = table_->Unregister(u, "bob");
  EXPECT_EQ(st.code(), C::kNotFound);
  EXPECT_EQ(st.message(), absl::StrCat("region_id ", id, " not found"));
  v1::RenewRegionsRequest renew;
  renew.add_region_ids(id);
  v1::RenewRegionsResponse renewed;
  ASSERT_TRUE(table_->Renew(renew, &renewed, "bob").ok());
  ASSERT_EQ(renewed.unknown_region_ids_size(), 1);
  EXPECT_EQ(renewed.unknown_region_ids(0), id);
  EXPECT_TRUE(table_->Resolve("alice", Ref(id, 0), 4, 4, "f").ok());
  EXPECT_TRUE(table_->Unregister(u, "alice").ok());
  EXPECT_EQ(table_->Unregister(u, "alice").code(), C::kNotFound);
}

TEST_F(RegionsTest, AttachTokensAreSingleUseAndExpire) {
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  absl::StatusOr<std::string> token = table_->AddPending(p, 4096, {});
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), kAttachTokenBytes);
  v1::RegisterRegionRequest r;
  r.set_kind(v1::REGION_HOST_SHM);
  r.set_attach_token(*token);
  v1::RegisterRegionResponse out;
  ASSERT_TRUE(table_->Register(r, &out, "alice").ok());
  EXPECT_EQ(out.size(), 4096u);
  EXPECT_EQ(out.lease_seconds(), 10u);
  absl::Status again = table_->Register(r, &out, "bob");
  EXPECT_EQ(again.code(), C::kNotFound);
  EXPECT_EQ(again.message(), "attach_token unknown, used already or expired");

  void* q = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  token = table_->AddPending(q, 4096, {});
  ASSERT_TRUE(token.ok());
  now_ += absl::Seconds(kAttachTokenSeconds + 1);
  r.set_attach_token(*token);
  EXPECT_EQ(table_->Register(r, &out, "alice").code(), C::kNotFound);

  r.set_attach_token("short");
  absl::Status bad = table_->Register(r, &out, "alice");
  EXPECT_EQ(bad.code(), C::kInvalidArgument);
  EXPECT_EQ(bad.message(), "attach_token has 5 bytes; must be 16");
  r.set_kind(v1::REGION_KIND_UNSPECIFIED);
  EXPECT_EQ(table_->Register(r, &out, "alice").code(), C::kInvalidArgument);
}

TEST_F(RegionsTest, PendingAttachmentsAreBounded) {
  for (int i = 0; i < kMaxPendingAttachments; ++i) {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_TRUE(table_->AddPending(p, 4096, {}).ok());
  }
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_EQ(table_->AddPending(p, 4096, {}).status().code(), C::kResourceExhausted);
  // Stale ones make room.
  now_ += absl::Seconds(kAttachTokenSeconds + 1);
  p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_TRUE(table_->AddPending(p, 4096, {}).ok());
  p = mmap(nullptr, 2 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_EQ(table_->AddPending(p, 2 << 20, {}).status().code(), C::kResourceExhausted);  // > max_region_bytes
}

TEST_F(RegionsTest, LeasesExpireUnlessRenewedOrUsed) {
  const uint64_t a = Host("alice", 4096);        // default lease, 10 s
  const uint64_t b = Host("alice", 4096, 1000);  // capped at 100 s
  const uint64_t c = Host("bob", 4096, 5);
  v1::RegisterRegionResponse unused;
  now_ += absl::Seconds(8);
  EXPECT_TRUE(table_->Resolve("alice", Ref(a, 0), 4, 4, "f").ok());  // a use extends the lease
  EXPECT_EQ(table_->ExpireIdle(), 1);                                // c (5 s)
  EXPECT_EQ(table_->Resolve("bob", Ref(c, 0), 4, 4, "f").status().code(), C::kNotFound);
  now_ += absl::Seconds(8);
  EXPECT_EQ(table_->ExpireIdle(), 0);  // a: used 8 s ago
  v1::RenewRegionsRequest renew;       // empty: all of alice's
  v1::RenewRegionsResponse renewed;
  ASSERT_TRUE(table_->Renew(renew, &renewed, "alice").ok());
  EXPECT_EQ(renewed.lease_seconds(), 10u);
  now_ += absl::Seconds(11);
  EXPECT_EQ(table_->ExpireIdle(), 1);  // a
  EXPECT_TRUE(table_->Resolve("alice", Ref(b, 0), 4, 4, "f").ok());
  now_ += absl::Seconds(101);
  EXPECT_EQ(table_->ExpireIdle(), 1);  // b, after its capped lease
  v1::StatsResponse stats;
  table_->Stats(&stats, "alice");
  EXPECT_EQ(stats.regions(), 0u);
  EXPECT_EQ(stats.regions_registered(), 3u);
  EXPECT_EQ(stats.regions_expired(), 3u);
  EXPECT_EQ(backend_.pinned, 3);
  EXPECT_EQ(backend_.unpinned, 3);
}

TEST_F(RegionsTest, UnregisteredWhileInUseStaysMappedUntilTheLastViewGoes) {
  const uint64_t id = Host("alice", 4096);
  absl::StatusOr<RegionView> v = table_->Resolve("alice", Ref(id, 0), 4096, 4, "f");
  ASSERT_TRUE(v.ok());
  v1::UnregisterRegionRequest u;
  u.set_region_id(id);
  ASSERT_TRUE(table_->Unregister(u, "alice").ok());
  EXPECT_EQ(table_->Resolve("alice", Ref(id, 0), 4, 4, "f").status().code(), C::kNotFound);
  EXPECT_EQ(backend_.unpinned, 0);
  std::memset(v->data, 0x5a, 4096);  // still mapped: no fault
  EXPECT_EQ(static_cast<unsigned char*>(v->data)[4095], 0x5a);
  v->keep_alive.reset();
  EXPECT_EQ(backend_.unpinned, 1);
}

TEST_F(RegionsTest, QuotasPerRegionAndPerTenant) {
  for (int i = 0; i < 3; ++i) Host("alice", 1 << 20);
  // 3 MiB held: one byte more passes max_region_bytes_per_tenant.
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  absl::StatusOr<std::string> token = table_->AddPending(p, 4096, {});
  ASSERT_TRUE(token.ok());
  v1::RegisterRegionRequest r;
  r.set_kind(v1::REGION_HOST_SHM);
  r.set_attach_token(*token);
  v1::RegisterRegionResponse out;
  absl::Status st = table_->Register(r, &out, "alice");
  EXPECT_EQ(st.code(), C::kResourceExhausted);
  EXPECT_NE(st.message().find("max_region_bytes_per_tenant"), absl::string_view::npos) << st;
  // Other tenants are not affected; bob hits max_regions (4) instead.
  for (int i = 0; i < 4; ++i) Host("bob", 4096);
  p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  token = table_->AddPending(p, 4096, {});
  ASSERT_TRUE(token.ok());
  r.set_attach_token(*token);
  st = table_->Register(r, &out, "bob");
  EXPECT_EQ(st.code(), C::kResourceExhausted);
  EXPECT_EQ(st.message(), "tenant holds 4 regions; max_regions is 4");
}

TEST_F(RegionsTest, CudaIpcHandlesAreRegisteredOnceAndClosed) {
  v1::RegisterRegionRequest r;
  r.set_kind(v1::REGION_CUDA_IPC);
  r.set_cuda_ipc_handle(std::string(kCudaIpcHandleBytes, '\x07'));
  r.set_device(0);
  r.set_size(1 << 16);
  v1::RegisterRegionResponse out;
  ASSERT_TRUE(table_->Register(r, &out, "alice").ok());
  const uint64_t id = out.region_id();
  absl::StatusOr<RegionView> v = table_->Resolve("alice", Ref(id, 256), 1024, 2, "f");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->space, MemorySpace::kDevice);
  EXPECT_EQ(v->device, 0);
  v = absl::CancelledError("dropped");
  absl::Status dup = table_->Register(r, &out, "bob");
  EXPECT_EQ(dup.code(), C::kAlreadyExists);
  EXPECT_EQ(dup.message(), "cuda_ipc_handle is registered already");
  r.set_cuda_ipc_handle(std::string(63, '\x01'));
  absl::Status shortened = table_->Register(r, &out, "alice");
  EXPECT_EQ(shortened.message(), "cuda_ipc_handle has 63 bytes; must be 64");
  r.set_cuda_ipc_handle(std::string(kCudaIpcHandleBytes, '\x08'));
  r.set_size(2 << 20);
  EXPECT_EQ(table_->Register(r, &out, "alice").code(), C::kOutOfRange);  // > max_region_bytes
  r.set_size(4096);
  r.set_device(3);
  EXPECT_EQ(table_->Register(r, &out, "alice").code(), C::kInvalidArgument);  // the backend's answer
  EXPECT_EQ(backend_.opened, 1);
  v1::UnregisterRegionRequest u;
  u.set_region_id(id);
  ASSERT_TRUE(table_->Unregister(u, "alice").ok());
  EXPECT_EQ(backend_.closed, 1);
  // The handle is free again.
  r.set_cuda_ipc_handle(std::string(kCudaIpcHandleBytes, '\x07'));
  r.set_device(0);
  EXPECT_TRUE(table_->Register(r, &out, "bob").ok());
}

TEST_F(RegionsTest, UnregisterAllEmptiesTheTableAndRefusesNewRegions) {
  Host("alice", 4096);
  const uint64_t id = Host("bob", 4096);
  absl::StatusOr<RegionView> v = table_->Resolve("bob", Ref(id, 0), 4, 4, "f");
  ASSERT_TRUE(v.ok());
  table_->UnregisterAll();
  v1::StatsResponse stats;
  table_->Stats(&stats, "bob");
  EXPECT_EQ(stats.regions(), 0u);
  EXPECT_EQ(stats.region_bytes(), 0u);
  EXPECT_EQ(backend_.unpinned, 1);  // bob's is still in use
  v->keep_alive.reset();
  EXPECT_EQ(backend_.unpinned, 2);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_EQ(table_->AddPending(p, 4096, {}).status().code(), C::kUnavailable);
}

TEST_F(RegionsTest, IdsAreNeverReused) {
  absl::flat_hash_set<uint64_t> seen;
  v1::UnregisterRegionRequest u;
  for (int i = 0; i < 200; ++i) {
    const uint64_t id = Host("alice", 4096);
    EXPECT_NE(id, 0u);
    EXPECT_TRUE(seen.insert(id).second);
    u.set_region_id(id);
    ASSERT_TRUE(table_->Unregister(u, "alice").ok());
  }
}

}  // namespace
}  // namespace driftkv
