// Handler::ApplyAppend and SealAppends: new tokens onto a layer, into its
// bf16 window and, as pages fill, encoded into pages; the many layers of
// one decode step encoded, checksummed and promoted together.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/handler.h"
#include "service/handler_internal.h"
#include "service/token_digest.h"
#include "wire/half.h"

namespace driftkv {

using handler_internal::Quoted;

namespace {

// Grows a bf16 window to `size` elements. New capacity doubles up to
// `most` (a window holds fewer than window_tokens + page_tokens tokens) and
// is written once when reserved: a decode step that then appends one token
// to each of 64 windows neither reallocates nor takes page faults (on a VM
// those cost ~5 us each, every other step).
void GrowWindow(std::vector<uint16_t>* w, size_t size, size_t most) {
  if (w->capacity() < size) {
    const size_t keep = w->size();
    w->reserve(std::max(size, std::min(2 * w->capacity(), most)));
    w->resize(w->capacity());
    w->resize(keep);
  }
  w->resize(size);
}

// Per-thread buffers of ApplyAppend's general path, kept between calls (a
// decode loop seals a page in every layer it steps, one call in
// page_tokens; fresh allocations of that size fault their pages in each
// time). A buffer grown past kMaxKeptBytes by a large Append is let go.
struct AppendScratch {
  std::vector<uint16_t> fresh_k, fresh_v;
  std::vector<float> keys, values;
};
constexpr size_t kMaxKeptBytes = size_t{8} << 20;
// SealGroup: no one item failed, a step of the whole group did.
constexpr size_t kNoCulprit = ~size_t{0};

class ThreadScratch {
 public:
  ThreadScratch() : s_(Get()) {}
  ~ThreadScratch() {
    Trim(&s_.fresh_k);
    Trim(&s_.fresh_v);
    Trim(&s_.keys);
    Trim(&s_.values);
  }
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
  AppendScratch* operator->() { return &s_; }

 private:
  static AppendScratch& Get() {
    thread_local AppendScratch s;
    return s;
  }
  template <class T>
  static void Trim(std::vector<T>* v) {
    if (v->capacity() * sizeof(T) > kMaxKeptBytes) std::vector<T>().swap(*v);
  }
  AppendScratch& s_;
};

}  // namespace

const uint16_t* Handler::Sealing::KeyRow(int64_t t, size_t n, int64_t encoded) const {
  if (staged != nullptr) return &all_k[(t - encoded) * n];
  return t < window ? &layer->window_keys[t * n] : &fresh_k[(t - window) * n];
}

const uint16_t* Handler::Sealing::ValueRow(int64_t t, size_t n, int64_t encoded) const {
  if (staged != nullptr) return &all_v[(t - encoded) * n];
  return t < window ? &layer->window_values[t * n] : &fresh_v[(t - window) * n];
}

absl::Status Handler::ApplyAppend(LayerState* layer, TenantUsage* usage, const LayerName& name, const AppendPlan& plan,
                                  const HostTokens& tokens, const std::vector<PageId>& pages, const HotTier::Held& held,
                                  const StagedTokens* staged, SealedPages* sealed) {
  if (plan.fresh == 0) return absl::OkStatus();
  const size_t n = this->n();
  if (staged == nullptr && plan.pages == 0) {
    // Only the window grows (a decode step between pages): append in
    // place. Copying the window, as a sealing append does, cost a 64-item
    // decode step ~128 MB of memcpy at a 128-token window.
    const int64_t window = static_cast<int64_t>(layer->window_keys.size() / n);
    const size_t most = static_cast<size_t>(options_.window_tokens + pool_->page_tokens()) * n;
    GrowWindow(&layer->window_keys, (window + plan.fresh) * n, most);
    GrowWindow(&layer->window_values, (window + plan.fresh) * n, most);
    tokens.CopyBf16(plan.skip * n, plan.fresh * n, layer->window_keys.data() + window * n,
                    layer->window_values.data() + window * n);
    for (int64_t t = window; t < window + plan.fresh; ++t) {
      layer->window_sums.push_back(WindowTokenSum(&layer->window_keys[t * n], &layer->window_values[t * n], n));
    }
    layer->length += plan.fresh;
    table_->CountTokens(0, plan.fresh);
    return absl::OkStatus();
  }
  Sealing s;
  s.layer = layer;
  s.usage = usage;
  s.name = name;
  s.plan = plan;
  s.tokens = tokens;
  s.staged = staged;
  s.pages = pages;
  s.sealed = sealed;
  size_t stored = 0, culprit = 0;
  return SealGroup(absl::MakeSpan(&s, 1), held, &stored, &culprit);
}

absl::Status Handler::SealAppends(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored) {
  const size_t page_bytes = static_cast<size_t>(pool_->page_tokens()) * n() * sizeof(float);
  *stored = 0;
  for (size_t at = 0; at < items.size();) {
    // A group: as many items as the scratch's floats hold (at least one).
    size_t end = at + 1, bytes = items[at].plan.pages * page_bytes;
    while (end < items.size() && bytes + items[end].plan.pages * page_bytes <= kMaxKeptBytes) {
      bytes += items[end].plan.pages * page_bytes;
      ++end;
    }
    size_t done = 0, culprit = kNoCulprit;
    absl::Status st = SealGroup(items.subspan(at, end - at), held, &done, &culprit);
    if (!st.ok() && done == 0 && culprit != kNoCulprit) {
      // One item's own check failed: those before it are stored first,
      // as ApplyAppend in turn would have (its checks are not run again:
      // a failure is counted once).
      size_t before = 0;
      absl::Status first = culprit > 0 ? SealAppends(items.subspan(at, culprit), held, &before) : absl::OkStatus();
      if (!first.ok()) {
        *stored = at + before;
        return first;
      }
      done = culprit;
    } else if (!st.ok() && done == 0 && end - at > 1) {
      // A step of the whole group failed, nothing stored: one by one, the
      // failing item fails with its own error after those before it are
      // stored.
      for (size_t i = at; i < end; ++i) {
        size_t one = 0;
        st = SealGroup(items.subspan(i, 1), held, &one, &culprit);
        if (!st.ok()) {
          *stored = i;
          return st;
        }
      }
      done = end - at;
    }
    if (!st.ok()) {
      *stored = at + done;
      return st;
    }
    at = end;
    *stored = at;
  }
  return absl::OkStatus();
}

absl::Status Handler::SealGroup(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored, size_t* culprit) {
  *stored = 0;
  *culprit = kNoCulprit;
  const size_t n = this->n();
  const size_t page_floats = static_cast<size_t>(pool_->page_tokens()) * n;
  ThreadScratch scratch;
  size_t floats = 0, fresh = 0;
  for (const Sealing& s : items) {
    if (s.staged != nullptr) continue;
    floats += s.plan.pages * page_floats;
    fresh += s.plan.fresh * n;
  }
  scratch->keys.resize(floats);
  scratch->values.resize(floats);
  scratch->fresh_k.resize(fresh);
  scratch->fresh_v.resize(fresh);
  floats = fresh = 0;
  for (Sealing& s : items) {
    absl::Status st = PrepareSeal(&s, scratch->keys.data() + floats, scratch->values.data() + floats,
                                  scratch->fresh_k.data() + fresh, scratch->fresh_v.data() + fresh);
    if (!st.ok()) {
      *culprit = static_cast<size_t>(&s - items.data());
      return st;
    }
    if (s.staged != nullptr) continue;
    floats += s.plan.pages * page_floats;
    fresh += s.plan.fresh * n;
  }
  if (absl::Status st = ReserveStraight(items, held, culprit); !st.ok()) return st;
  if (absl::Status st = EncodeGroup(items); !st.ok()) return st;
  for (Sealing& s : items) {
    if (absl::Status st = CheckSeal(&s); !st.ok()) {
      *culprit = static_cast<size_t>(&s - items.data());
      return st;
    }
  }
  // Checksums of the new cold pages, before any promotion, as the backend
  // holds them (on cuda the device's copy, which the host arena mirrors: a
  // Read that checks the mirror then checks the copy too). Pages encoded
  // straight into level form came with theirs.
  std::vector<PageId> pages;
  for (const Sealing& s : items) {
    if (s.straight.empty()) pages.insert(pages.end(), s.pages.begin(), s.pages.end());
  }
  std::vector<PageChecksum> sums;
  if (absl::Status st = verifier_->ColdSums(pages, &sums); !st.ok()) return st;
  size_t at = 0;
  for (Sealing& s : items) {
    if (!s.straight.empty()) continue;
    s.sums.assign(sums.begin() + at, sums.begin() + at + s.pages.size());
    at += s.pages.size();
  }
  return PlaceSealed(items, held, stored, culprit);
}

absl::Status Handler::ReserveStraight(absl::Span<Sealing> items, const HotTier::Held& held, size_t* culprit) {
  // Pages the prefix index keys need their cold form kept, and staged
  // tokens are encoded where they lie (EncodeStaged): those pages go cold
  // first and are promoted after (PlaceSealed).
  std::vector<HotTier::NewPagesWanted> wanted;
  std::vector<size_t> item;
  for (size_t i = 0; i < items.size(); ++i) {
    Sealing& s = items[i];
    if (hot_ == nullptr || !s.layer->hot || s.pages.empty() || s.staged != nullptr) continue;
    if (s.sealed != nullptr && s.sealed->keyed > 0) continue;
    wanted.push_back(HotTier::NewPagesWanted{s.layer, s.usage, &s.name, static_cast<int64_t>(s.pages.size()),
                                             pool_->partition_of(s.pages[0]), &s.straight});
    item.push_back(i);
  }
  if (wanted.empty()) return absl::OkStatus();
  size_t failed = 0;
  absl::Status st = hot_->ReserveNewPages(wanted, held, &failed);
  if (!st.ok()) *culprit = item[failed];
  return st;
}

absl::Status Handler::EncodeGroup(absl::Span<Sealing> items) {
  // One EncodePages for the group's cold pages of host tokens and one
  // EncodeLevelPages for its straight ones (on cuda: one upload, one
  // launch sequence, one synchronisation each).
  std::vector<EncodeJob> jobs, straight;
  std::vector<PageId> hot;
  for (Sealing& s : items) {
    if (s.staged != nullptr) continue;
    std::vector<EncodeJob>& to = s.straight.empty() ? jobs : straight;
    for (EncodeJob& j : s.jobs) to.push_back(std::move(j));
    hot.insert(hot.end(), s.straight.pages().begin(), s.straight.pages().end());
  }
  std::vector<PageChecksum> cold_sums(straight.size()), hot_sums(straight.size());
  absl::Status st = jobs.empty() ? absl::OkStatus() : backend_->EncodePages(absl::MakeSpan(jobs));
  if (st.ok() && !straight.empty()) {
    st = backend_->EncodeLevelPages(absl::MakeSpan(straight), hot, *pool_, *hot_pool_, cold_sums.data(),
                                    hot_sums.data());
  }
  size_t k = 0, h = 0;
  for (Sealing& s : items) {
    if (s.staged != nullptr) continue;
    if (s.straight.empty()) {
      for (EncodeJob& j : s.jobs) j = std::move(jobs[k++]);
      continue;
    }
    for (EncodeJob& j : s.jobs) j = std::move(straight[h++]);
    s.sums.assign(cold_sums.begin() + (h - s.jobs.size()), cold_sums.begin() + h);
    s.hot_sums.assign(hot_sums.begin() + (h - s.jobs.size()), hot_sums.begin() + h);
    s.hot = s.straight.pages();
  }
  return st.ok() ? st : EncodingError(items[0], st);
}

absl::Status Handler::EncodingError(const Sealing& s, const absl::Status& st) const {
  const int64_t first = static_cast<int64_t>(s.layer->pages.size()) * pool_->page_tokens();
  return absl::Status(st.code(), absl::StrCat("encoding tokens [", first, ", ",
                                              first + s.plan.pages * pool_->page_tokens(), "): ", st.message()));
}

absl::Status Handler::PrepareSeal(Sealing* s, float* keys, float* values, uint16_t* fresh_k, uint16_t* fresh_v) {
  // A group that failed is run again one item at a time: start clean.
  s->all_k.clear();
  s->all_v.clear();
  s->window_sums.clear();
  s->digests.clear();
  s->sums.clear();
  s->hot_sums.clear();
  s->hot.clear();
  s->straight = HotTier::NewPagesReservation();
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  const LayerState& layer = *s->layer;
  s->window = static_cast<int64_t>(layer.window_keys.size() / n);
  const int64_t encoded = s->plan.pages * p;
  s->jobs.assign(s->plan.pages, EncodeJob());
  for (int64_t i = 0; i < s->plan.pages; ++i) {
    s->jobs[i].page = s->pages[i];
    s->jobs[i].layer = s->name.layer;
  }
  // The window's tokens that go into pages must be what was stored: a page
  // encoded from a corrupt window would carry a fresh, valid checksum.
  absl::Status st = verifier_->VerifyWindow(layer, 0, std::min(s->window, encoded), s->name, "encoded into a page");
  if (!st.ok()) return st;
  if (s->staged != nullptr) {
    st = backend_->EncodeStaged(*s->staged, static_cast<int>(n), static_cast<int>(p), s->plan.skip, s->plan.fresh,
                                layer.window_keys, layer.window_values, absl::MakeSpan(s->jobs), &s->all_k, &s->all_v);
    return st.ok() ? st : EncodingError(*s, st);
  }
  // S = [window; new tokens] in bf16: the window stays where it is until
  // the commit, the new tokens go to `fresh_k`/`fresh_v`. Nothing holds the
  // whole of S: a decode step that seals a page would copy the window (a
  // page and more) for every item.
  s->tokens.CopyBf16(s->plan.skip * n, s->plan.fresh * n, fresh_k, fresh_v);
  s->fresh_k = fresh_k;
  s->fresh_v = fresh_v;
  // The paged tokens as the encoder reads them: the window's first, then
  // the new ones.
  const int64_t from_window = std::min(s->window, encoded);
  Bf16ToFloats(layer.window_keys.data(), from_window * n, keys);
  Bf16ToFloats(layer.window_values.data(), from_window * n, values);
  Bf16ToFloats(fresh_k, (encoded - from_window) * n, keys + from_window * n);
  Bf16ToFloats(fresh_v, (encoded - from_window) * n, values + from_window * n);
  for (int64_t i = 0; i < s->plan.pages; ++i) {
    s->jobs[i].keys = keys + i * p * n;
    s->jobs[i].values = values + i * p * n;
  }
  return absl::OkStatus();
}

absl::Status Handler::CheckSeal(Sealing* s) {
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  const LayerState& layer = *s->layer;
  const int64_t encoded = s->plan.pages * p, end = s->window + s->plan.fresh;
  // The window after this append: S[encoded, end). Tokens that were in the
  // window keep their checksums (never recomputed from the bytes, which
  // would launder a corruption); the staged path's come back from the
  // backend's staging and must match.
  s->window_sums.resize(end - encoded);
  for (int64_t t = encoded; t < end; ++t) {
    const PageChecksum sum = t < s->window && s->staged == nullptr
                                 ? layer.window_sums[t]
                                 : WindowTokenSum(s->KeyRow(t, n, encoded), s->ValueRow(t, n, encoded), n);
    if (t < s->window && sum != layer.window_sums[t]) {
      verifier_->CountFailure(kCheckWindow);
      return absl::DataLossError(absl::StrFormat(
          "token %d of the bf16 window of layer %d of sequence_id %s came back from the %s backend's staging "
          "different from what was stored: stored crc32c %08x, computed %08x; nothing stored",
          static_cast<int64_t>(layer.pages.size()) * p + t, s->name.layer, Quoted(s->name.sequence_id),
          backend_->name(), layer.window_sums[t], sum));
    }
    s->window_sums[t - encoded] = sum;
  }
  // TokenDigest of each token encoded into pages here; kNoDigest for tokens
  // encoded from device staging, whose bf16 form never reaches the host.
  s->digests.assign(encoded, kNoDigest);
  if (s->staged == nullptr) {
    for (int64_t t = 0; t < encoded; ++t)
      s->digests[t] = TokenDigest(s->KeyRow(t, n, encoded), s->ValueRow(t, n, encoded), n);
  }
  return absl::OkStatus();
}

absl::Status Handler::PlaceSealed(absl::Span<Sealing> items, const HotTier::Held& held, size_t* stored,
                                  size_t* culprit) {
  // A hot layer's new pages go hot at once; with no hot page to be had,
  // even after demoting other layers, the layer goes cold instead (an
  // Append is never refused for the hot tier's sake). Several layers of
  // one tenant go together when they all fit, else one by one.
  std::vector<HotTier::NewPages> batch;
  bool one_tenant = true;
  for (Sealing& s : items) {
    if (!s.layer->hot || s.pages.empty() || !s.straight.empty()) continue;
    one_tenant = one_tenant && (batch.empty() || s.usage == items[0].usage);
    batch.push_back(HotTier::NewPages{s.layer, &s.pages, &s.hot, &s.hot_sums});
  }
  const bool placed =
      batch.empty() || (batch.size() > 1 && one_tenant && hot_->PlaceNewPagesTogether(items[0].usage, batch, held));
  for (size_t i = 0; i < items.size(); ++i) {
    Sealing& s = items[i];
    if (!placed && s.layer->hot && !s.pages.empty() && s.straight.empty()) {
      absl::Status st = hot_->PlaceNewPages(s.layer, s.usage, s.name, s.pages, held, &s.hot, &s.hot_sums);
      if (!st.ok()) {
        *stored = i;
        *culprit = i;
        return st;
      }
    }
    CommitSeal(&s);
  }
  *stored = items.size();
  return absl::OkStatus();
}

void Handler::CommitSeal(Sealing* s) {
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  LayerState* layer = s->layer;
  const int64_t encoded = s->plan.pages * p;
  if (!s->jobs.empty()) RecordEncoded(s->jobs);
  // The index gets references of its own to the cold pages, taken before a
  // hot layer lets them go.
  if (s->sealed != nullptr && s->sealed->keyed > 0) {
    for (int64_t i = 0; i < s->sealed->keyed; ++i) {
      s->sealed->pages.push_back(
          PrefixIndex::Page{s->pages[i], s->sums[i],
                            std::vector<uint64_t>(s->digests.begin() + i * p, s->digests.begin() + (i + 1) * p)});
    }
    pool_->Retain(absl::MakeConstSpan(s->pages).first(s->sealed->keyed));
  }
  if (!s->straight.empty()) {
    hot_->CountEncodedHot(static_cast<int64_t>(s->hot.size()));
    s->straight.Keep();
  }
  if (!s->hot.empty()) {
    const size_t first = layer->pages.size();
    layer->pages.insert(layer->pages.end(), s->hot.begin(), s->hot.end());
    layer->hot_sums.Append(s->hot_sums);
    if (s->straight.empty()) {
      // Placed from their cold form: those pages are exact copies.
      hot_->KeepPlacedCopies(*layer, first, std::move(s->pages));
    } else {
      // Encoded straight: the cold page was the encoder's scratch (on the
      // GPU its host mirror is never written), not a copy to keep.
      pool_->Free(s->pages);
    }
  } else {
    layer->pages.insert(layer->pages.end(), s->pages.begin(), s->pages.end());
  }
  layer->digests.insert(layer->digests.end(), s->digests.begin(), s->digests.end());
  layer->page_sums.insert(layer->page_sums.end(), s->sums.begin(), s->sums.end());
  if (s->staged != nullptr) {
    layer->window_keys.assign(s->all_k.begin(), s->all_k.end());
    layer->window_values.assign(s->all_v.begin(), s->all_v.end());
  } else {
    // In place: the window's tokens that stay move to its front, the new
    // ones that stay follow (the window's capacity, written once, holds).
    const int64_t window = s->window, fresh = s->plan.fresh;
    const size_t most = static_cast<size_t>(options_.window_tokens + p) * n;
    const int64_t stay = std::max<int64_t>(0, window - encoded);  // of the old window
    const int64_t from_fresh = std::max<int64_t>(0, encoded - window);
    if (stay > 0 && encoded > 0) {
      std::memmove(layer->window_keys.data(), layer->window_keys.data() + encoded * n, stay * n * sizeof(uint16_t));
      std::memmove(layer->window_values.data(), layer->window_values.data() + encoded * n, stay * n * sizeof(uint16_t));
    }
    const size_t size = (stay + fresh - from_fresh) * n;
    layer->window_keys.resize(stay * n);
    layer->window_values.resize(stay * n);
    GrowWindow(&layer->window_keys, size, std::max(most, size));
    GrowWindow(&layer->window_values, size, std::max(most, size));
    std::memcpy(layer->window_keys.data() + stay * n, s->fresh_k + from_fresh * n,
                (fresh - from_fresh) * n * sizeof(uint16_t));
    std::memcpy(layer->window_values.data() + stay * n, s->fresh_v + from_fresh * n,
                (fresh - from_fresh) * n * sizeof(uint16_t));
  }
  layer->window_sums = std::move(s->window_sums);
  layer->length += s->plan.fresh;
  table_->CountTokens(encoded, s->plan.fresh - encoded);
}

}  // namespace driftkv
