// Handler: the snapshot of a drained server
// (GRACEFUL DRAIN AND WARM RESTART in handler.h; the file format is
// service/snapshot_file.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "service/handler.h"
#include "service/handler_internal.h"
#include "service/snapshot_file.h"
#include "service/snapshot_pages.h"
#include "service/tenant.h"
#include "service/token_digest.h"

namespace driftkv {

using handler_internal::Quoted;

namespace {

// Lines name clients' ids: Quoted escapes them, ForLog anything else.
void Log(const std::string& line) {
  std::cerr << "driftkv-server: snapshot: " << ForLog(line) << std::endl;
}

// A table key as a log names it: `sequence_id "chat" of tenant "alice"`
// for a tenant's key (service/tenant.h), else the escaped key.
std::string DescribeKey(const std::string& key) {
  const std::string tenant = TenantOfKey(key);
  if (tenant.empty() || key.size() < tenant.size() + 2) return absl::StrCat("sequence_id ", Quoted(key));
  return absl::StrCat("sequence_id ", Quoted(absl::string_view(key).substr(tenant.size() + 2)), " of tenant ",
                      Quoted(tenant));
}

constexpr absl::string_view kTenancyKey = "tenancy=";

const char* TenancyName(bool tokens) {
  return tokens ? "tokens" : "none";
}

// `identity` without its tenancy line (to compare with a snapshot older
// than kSnapshotFirstTenancyVersion, which has none).
std::string WithoutTenancy(absl::string_view identity) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(identity, absl::ByString("\n"), absl::SkipEmpty())) {
    if (!absl::StartsWith(line, kTenancyKey)) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// Why the table key `key` of a snapshot cannot be restored ("" if it can).
// `known`: the snapshot records its tenancy, and it is this server's
// (`tokens`). A key of a named tenant is "\0" tenant "\0" id
// (service/tenant.h); ids never hold NUL or control bytes. Without a
// record, a NUL may be a planted id's, not a tenant's: such keys are not
// restored at all.
std::string KeyProblem(const std::string& key, bool known, bool tokens) {
  if (!known) {
    if (handler_internal::ControlByteOffset(key) < 0) return "";
    return "the snapshot does not record whether it was written with tokens, and the key has a NUL or control byte "
           "(a tenant's, or an id of a server without tokens that would become a tenant's)";
  }
  if (!tokens) {
    const int64_t at = handler_internal::ControlByteOffset(key);
    return at < 0 ? "" : absl::StrCat("byte ", at, " of the id is a NUL or control byte");
  }
  const size_t end = key.empty() || key[0] != '\0' ? std::string::npos : key.find('\0', 1);
  if (end == std::string::npos || end == 1) return "the key names no tenant, but the snapshot was written with tokens";
  const absl::string_view id = absl::string_view(key).substr(end + 1);
  if (id.empty() || handler_internal::ControlByteOffset(id) >= 0) {
    return "the id part of the tenant's key is empty or has a NUL or control byte";
  }
  return "";
}

}  // namespace

std::string Handler::RestoreReport(const std::string& dir, const SnapshotSummary& s) {
  std::string line;
  if (!s.found) {
    line = absl::StrCat("no snapshot in ", dir, "; nothing restored");
    if (!s.already_loaded.empty()) {
      absl::StrAppend(&line, " (", s.already_loaded, " was loaded at an earlier start and is not loaded twice)");
    }
  } else {
    line = absl::StrCat("restored ", s.sequences, " sequences (", s.pages, " pages) from ", s.path, "; ",
                        s.corrupt_pages, " corrupt pages, ", s.dropped_sequences, " sequences dropped",
                        s.rest_lost ? ", the rest of the file lost to a corrupt record" : "");
    if (s.pages_on_host + s.pages_on_disk > 0 || s.disk_records_erased > 0) {
      absl::StrAppend(&line, "; of the pages ", s.pages_on_host, " back on the host level, ", s.pages_on_disk,
                      " left in the disk level's records (", s.disk_records_erased,
                      " records no sequence names erased)");
    }
    if (!s.disk_level_open.empty()) absl::StrAppend(&line, "; ", s.disk_level_open);
  }
  if (!s.removed_temporary.empty()) {
    absl::StrAppend(&line, "; removed ", s.removed_temporary, " (an interrupted snapshot write, never complete)");
  }
  return line;
}

std::string Handler::SnapshotIdentity() const {
  const KvCodec::Settings c = codec_->settings();
  return absl::StrCat("codec=", codec_->name(), "\npage_format=", options_.page_format, "\nlayers=", options_.layers,
                      "\nkv_heads=", codec_->kv_heads(), "\nhead_dim=", codec_->head_dim(),
                      "\nkey_levels=", c.key_levels, "\nvalue_levels=", c.value_levels,
                      "\nkey_payload_bytes=", c.key_payload_bytes, "\nvalue_payload_bytes=", c.value_payload_bytes,
                      "\nalpha=", absl::StrFormat("%.17g", c.alpha), "\npage_tokens=", pool_->page_tokens(),
                      "\npage_bytes=", pool_->page_stride(), "\nwindow_tokens=", options_.window_tokens,
                      "\ntransform=", TransformName(options_.transform),
                      "\ntransforms_checksum=", absl::Hex(transforms_checksum_, absl::kZeroPad16),
                      "\nvalues_folded=", options_.values_folded ? 1 : 0, "\n", kTenancyKey,
                      TenancyName(options_.tokens != nullptr), "\n");
}

absl::Status Handler::WriteSnapshot(const std::string& dir, SnapshotSummary* summary) {
  DrainPromotions();
  std::vector<std::pair<std::string, SequencePtr>> all = table_->Entries();
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });  // a stable file for a stable table
  // The records of the disk level that the file names must outlive this
  // process; a server without levels writes the version before them, which
  // the release before them reads.
  if (spill_ != nullptr) spill_->Freeze();
  absl::StatusOr<std::unique_ptr<SnapshotWriter>> writer =
      SnapshotWriter::Open(dir, SnapshotIdentity(), pool_->page_stride(),
                           spill_ != nullptr ? kSnapshotVersion : kSnapshotFirstLevelVersion - 1);
  if (!writer.ok()) return writer.status();
  summary->path = SnapshotPath(dir);
  // Released ids stay released across the restart (for their time left).
  std::vector<std::pair<std::string, uint64_t>> tombstones;
  for (const auto& [key, left] : table_->TombstoneEntries()) {
    tombstones.emplace_back(key, static_cast<uint64_t>(absl::ToInt64Nanoseconds(left)));
  }
  std::sort(tombstones.begin(), tombstones.end());
  if (absl::Status st = (*writer)->Tombstones(tombstones); !st.ok()) return st;
  // Every hot layer in cold form first. A demotion takes pool pages, which
  // moving other sequences below can free only while the writer holds no
  // reference to their pages (SnapshotPagesWritten keeps one to each page
  // written). A failure here is met again, and reported, as the sequence
  // is written.
  for (const auto& [key, seq] : all) {
    absl::MutexLock seq_lock(&seq->mu);
    if (seq->released || seq->below) continue;
    for (size_t l = 0; l < seq->layers.size(); ++l) {
      LayerState& layer = seq->layers[l];
      absl::MutexLock layer_lock(&layer.mu);
      if (layer.hot && !layer.pages.empty()) {
        hot_->DemoteLocked(&layer, seq->usage, LayerName{key, static_cast<int>(l)}, kDemoteDrain).IgnoreError();
      }
    }
  }
  std::vector<uint64_t> digests;
  const size_t n = this->n();
  SnapshotPagesWritten written(pool_.get());
  for (const auto& [key, seq] : all) {
    absl::MutexLock seq_lock(&seq->mu);
    if (seq->released) continue;
    // First every layer in cold form, every page and window checked: a
    // sequence goes into the file whole or not at all, and the file's CRCs
    // (computed by the writer) never vouch for bytes that were corrupt.
    absl::Status bad;
    size_t below = 0;  // index into below_keys, layer-major
    for (size_t l = 0; l < seq->layers.size() && bad.ok(); ++l) {
      LayerState& layer = seq->layers[l];
      absl::MutexLock layer_lock(&layer.mu);
      const LayerName name{key, static_cast<int>(l)};
      if (seq->below) {
        // On disk the store checks each record as it comes back; on the
        // host level the bytes go into the file, so they are checked here.
        for (size_t i = 0; i < layer.pages.size() && bad.ok(); ++i, ++below) {
          if (seq->below_on_host &&
              Crc32c(spill_->HostSlot(seq->below_keys[below]), pool_->page_stride()) != layer.page_sums[i]) {
            verifier_->CountFailure(kCheckSnapshot);
            bad =
                absl::DataLossError(absl::StrCat("page ", i, " of layer ", l, " fails its checksum on the host level"));
          }
        }
      } else if (layer.hot && !layer.pages.empty()) {
        bad = hot_->DemoteLocked(&layer, seq->usage, name, kDemoteDrain);
      }
      if (bad.ok() && !seq->below)
        bad = verifier_->VerifyColdPages(layer.pages, layer.page_sums, 0, PageVerifier::Copy::kHost, name,
                                         kCheckSnapshot);
      if (bad.ok()) {
        bad = verifier_->VerifyWindow(layer, 0, static_cast<int64_t>(layer.window_sums.size()), name,
                                      "written to the snapshot");
      }
    }
    if (!bad.ok()) {
      Log(absl::StrCat(DescribeKey(key), " not written: ", bad.message()));
      ++summary->dropped_sequences;
      continue;
    }
    const std::string space(NamespaceOf(TenantOfKey(key)).view());
    absl::Status st = (*writer)->BeginSequence(key, static_cast<uint32_t>(seq->layers.size()));
    below = 0;
    for (size_t l = 0; l < seq->layers.size() && st.ok(); ++l) {
      LayerState& layer = seq->layers[l];
      absl::ReaderMutexLock layer_lock(&layer.mu);
      st = (*writer)->BeginLayer(static_cast<uint64_t>(layer.length),
                                 static_cast<uint32_t>(layer.window_keys.size() / n),
                                 static_cast<uint32_t>(layer.pages.size()), layer.window_keys, layer.window_values);
      for (size_t i = 0; i < layer.pages.size() && st.ok(); ++i) {
        if (!seq->below) {
          st = WritePage(writer->get(), &written, space, layer.pages[i], layer.page_sums[i], summary);
        } else if (seq->below_on_host) {
          st = (*writer)->HostPage(spill_->HostSlot(seq->below_keys[below++]), layer.page_sums[i]);
          ++summary->pages_on_host;
        } else {
          st = (*writer)->DiskPage(seq->below_keys[below++], layer.page_sums[i]);
          ++summary->pages_on_disk;
        }
      }
      // One digest per paged token (kNoDigest where none was kept), so
      // that restored paged tokens are compared on repeat as before.
      digests.assign(layer.digests.begin(),
                     layer.digests.begin() + std::min(layer.digests.size(), layer.pages.size() * pool_->page_tokens()));
      digests.resize(layer.pages.size() * pool_->page_tokens(), kNoDigest);
      if (st.ok()) st = (*writer)->Digests(digests);
      summary->pages += layer.pages.size();
    }
    if (!st.ok()) return st;
    ++summary->sequences;
  }
  if (absl::Status st = WriteIndexAndPins(writer->get(), &written, summary); !st.ok()) return st;
  return (*writer)->Commit();
}

absl::Status Handler::WritePage(SnapshotWriter* writer, SnapshotPagesWritten* written, const std::string& space,
                                PageId page, PageChecksum sum, SnapshotSummary* summary) {
  // A page the file already holds for this namespace (a fork's shared
  // page, a shared hot page demoted per holder, an index page a sequence
  // also holds) is written once.
  if (std::optional<uint64_t> ordinal = written->Find(space, sum, page)) {
    ++summary->shared_pages;
    return writer->SharedPage(*ordinal);
  }
  const uint64_t ordinal = writer->full_pages();
  absl::Status st = writer->Page(pool_->page(page), sum);
  if (st.ok()) written->Add(space, sum, page, ordinal);
  return st;
}

absl::Status Handler::WriteIndexAndPins(SnapshotWriter* writer, SnapshotPagesWritten* written,
                                        SnapshotSummary* summary) {
  if (writer->version() < kSnapshotFirstSharedVersion) return absl::OkStatus();
  const size_t p = static_cast<size_t>(pool_->page_tokens());
  const std::vector<PrefixIndex::Entry> entries = index_->Entries();
  absl::Status st = writer->BeginIndex(entries.size());
  std::vector<uint64_t> digests;
  for (size_t i = 0; i < entries.size() && st.ok(); ++i) {
    const PrefixIndex::Entry& e = entries[i];
    st = writer->IndexEntry(e.ns.view(), e.key.view(), static_cast<uint32_t>(e.layer));
    if (st.ok()) st = WritePage(writer, written, std::string(e.ns.view()), e.page.page, e.page.sum, summary);
    digests.assign(e.page.digests.begin(), e.page.digests.begin() + std::min(e.page.digests.size(), p));
    digests.resize(p, kNoDigest);
    if (st.ok()) st = writer->Digests(digests);
    ++summary->index_entries;
  }
  const absl::Time now = clock_();
  const std::vector<PinTable::Entry> pins = pins_->Entries(now);
  if (st.ok()) st = writer->BeginPins(pins.size());
  for (size_t i = 0; i < pins.size() && st.ok(); ++i) {
    const PinTable::Entry& pin = pins[i];
    const std::string space(NamespaceOf(TenantOfKey(pin.key)).view());
    st = writer->Pin(pin.key, pin.pin_id, static_cast<uint64_t>(absl::ToInt64Nanoseconds(pin.expires - now)),
                     static_cast<uint32_t>(pin.pages.size()));
    for (size_t k = 0; k < pin.pages.size() && st.ok(); ++k) {
      const PageId page = pin.pages[k];
      st = WritePage(writer, written, space, page, Crc32c(pool_->page(page), pool_->page_stride()), summary);
    }
    ++summary->pins;
  }
  return st;
}

absl::Status Handler::LoadSnapshot(const std::string& dir, SnapshotSummary* summary) {
  const std::string path = SnapshotPath(dir);
  summary->path = path;
  // A write killed before its rename leaves snapshot.dkvs.tmp: never a
  // whole snapshot (the rename is what makes one), so it is removed.
  const std::string tmp = path + ".tmp";
  if (std::remove(tmp.c_str()) == 0) {
    summary->removed_temporary = tmp;
    Log(absl::StrCat("removed ", tmp, ", left by a snapshot write that was interrupted before it completed"));
  }
  absl::StatusOr<std::unique_ptr<SnapshotReader>> reader = SnapshotReader::Open(path);
  if (!reader.ok()) {
    const std::string loaded = path + ".loaded";
    if (absl::IsNotFound(reader.status()) && std::ifstream(loaded).good()) summary->already_loaded = loaded;
    return reader.status();
  }
  summary->found = true;
  if (spill_ != nullptr && spill_->disk_store() != nullptr) {
    const tiers::DiskPageStoreStats d = spill_->disk_store()->stats();
    summary->disk_level_open = absl::StrFormat(
        "the disk level's index of %d records restored from %d segment footers (%d segments scanned), "
        "%d bytes read in %.3f s",
        d.pages, d.open_segments_footer, d.open_segments_scanned, d.open_bytes_read, d.open_seconds);
  }
  // Keys carry tenants only with tokens: a snapshot of the other mode would
  // give ids to other tenants (or an id that holds a NUL to a tenant).
  const bool tokens = options_.tokens != nullptr;
  const bool tenancy_known = (*reader)->version() >= kSnapshotFirstTenancyVersion;
  const std::string server_identity = tenancy_known ? SnapshotIdentity() : WithoutTenancy(SnapshotIdentity());
  if (std::string diff = IdentityDifference((*reader)->identity(), server_identity); !diff.empty()) {
    if (absl::StartsWith(diff, "tenancy:")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "snapshot ", path, " was written by a server ", tokens ? "without" : "with",
          " bearer tokens, and this one runs ", tokens ? "with" : "without", " them (", diff,
          "); its sequence ids would change tenants; refusing to load it; start with the tokens_file setting that "
          "wrote it, or move the file away to start empty"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", path, " was written with another codec or shape (", diff,
        "); refusing to load it; start with the config that wrote it, or move the file away to start empty"));
  }
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  const uint32_t max_window = static_cast<uint32_t>(options_.window_tokens + p);
  const bool with_digests = (*reader)->version() >= kSnapshotFirstDigestVersion;
  if (with_digests && !(*reader)->tombstones_intact()) {
    Log(absl::StrCat("the tombstones of ", path, " fail their checksum; released ids are not restored as released"));
  }
  if (options_.tombstone_seconds > 0) {
    // For at most this server's tombstone_seconds; the time spent down is
    // not counted (a tombstone lasts longer, never shorter).
    const absl::Duration lifetime = absl::Seconds(options_.tombstone_seconds);
    for (const auto& [key, left_ns] : (*reader)->tombstones()) {
      if (!KeyProblem(key, tenancy_known, tokens).empty()) continue;
      table_->RestoreTombstone(key, std::min(lifetime, absl::Nanoseconds(static_cast<int64_t>(left_ns))));
    }
  }
  std::vector<uint64_t> digests;
  SnapshotPagesRestored restored(pool_.get());
  auto drop = [&](const std::string& id, const std::string& why) {
    // The key as the file has it: its tenant part may be a planted id's.
    Log(absl::StrCat("sequence_id ", Quoted(id), " not restored: ", why));
    ++summary->dropped_sequences;
    ++totals_.snapshot_dropped_sequences;
    metrics_->snapshot_dropped_sequences->Increment();
  };
  absl::Status framing;
  for (;;) {
    bool more = false;
    std::string id;
    uint32_t layers = 0;
    framing = (*reader)->NextSequence(&more, &id, &layers);
    if (!framing.ok() || !more) break;
    if (layers != static_cast<uint32_t>(options_.layers)) {
      framing = absl::DataLossError(
          absl::StrCat("sequence_id ", Quoted(id), " has ", layers, " layers; the identity says ", options_.layers));
      break;
    }
    // The key names the tenant (service/tenant.h); the sequence goes to the
    // least loaded device slot, as a new one would.
    TenantUsage* usage = table_->Usage(TenantOfKey(id));
    const int device = table_->PlaceNew();
    auto seq = std::make_shared<Sequence>(id, options_.layers, usage, device);
    // The first reason to drop this sequence; empty: keep.
    std::string why = KeyProblem(id, tenancy_known, tokens);
    std::vector<PageId> reserved;  // pool pages
    int64_t held = 0;              // every page, wherever it is (what the tenant is charged)
    // Where the sequence's pages are: all in the pool (the file's pages),
    // or all on one level below (kHost: slots taken and filled here; kDisk:
    // the disk level's records), as a sequence below always is.
    std::optional<SnapshotReader::PageEntry::Kind> level;
    std::vector<uint64_t> below_keys;
    std::vector<uint64_t> host_slots;  // taken for this sequence, given back if it is dropped
    std::vector<uint16_t> keys, values;
    for (uint32_t l = 0; l < layers && framing.ok(); ++l) {
      LayerState& layer = seq->layers[l];
      SnapshotReader::LayerHeader h;
      bool window_intact = true;
      framing = (*reader)->NextLayer(n, max_window, &h, &keys, &values, &window_intact);
      if (!framing.ok()) break;
      if (static_cast<uint64_t>(h.pages) * p + h.window_tokens != h.length) {
        framing =
            absl::DataLossError(absl::StrCat("layer ", l, " of sequence_id ", Quoted(id), ": ", h.pages, " pages and ",
                                             h.window_tokens, " window tokens do not make ", h.length, " tokens"));
        break;
      }
      if (!window_intact && why.empty()) {
        why = absl::StrCat("the bf16 window of layer ", l, " fails its checksum");
        ++summary->corrupt_pages;
        ++totals_.snapshot_corrupt_pages;
        metrics_->snapshot_corrupt_pages->Increment();
      }
      // Each page of the layer: a full page into a page of its own (or
      // into scratch once the sequence is lost), or a repeat of a full
      // page restored earlier, shared by reference.
      std::vector<PageId> pages;
      std::vector<uint8_t> scratch;  // pages that are read but not kept
      for (uint32_t i = 0; i < h.pages && framing.ok(); ++i) {
        auto lost = [&](const std::string& reason) {
          if (why.empty())
            why = absl::StrFormat("page %d (tokens [%d, %d)) of layer %d %s", i, static_cast<int64_t>(i) * p,
                                  static_cast<int64_t>(i + 1) * p, l, reason);
        };
        SnapshotReader::PageEntry entry;
        framing = (*reader)->NextPageEntry(&entry);
        if (!framing.ok()) break;
        const bool in_pool =
            entry.kind == SnapshotReader::PageEntry::kFull || entry.kind == SnapshotReader::PageEntry::kShared;
        const SnapshotReader::PageEntry::Kind here = in_pool ? SnapshotReader::PageEntry::kFull : entry.kind;
        if (!level.has_value()) level = here;
        if (*level != here) lost("is on another level than the sequence's other pages");
        // Reads the entry's page into `dst` (into scratch when null); one
        // that fails its CRC is counted and loses the sequence.
        auto read_page = [&](uint8_t* dst, PageChecksum* stored, bool* intact) {
          if (dst == nullptr) {
            scratch.resize(pool_->page_stride());
            dst = scratch.data();
          }
          framing = (*reader)->Page(pool_->page_stride(), dst, stored, intact);
          if (framing.ok() && !*intact) {
            ++summary->corrupt_pages;
            ++totals_.snapshot_corrupt_pages;
            metrics_->snapshot_corrupt_pages->Increment();
            verifier_->CountFailure(kCheckSnapshot);
            lost(absl::StrFormat("fails its checksum (stored crc32c %08x)", *stored));
          }
        };
        if (entry.kind == SnapshotReader::PageEntry::kDisk) {
          if (spill_ == nullptr || spill_->disk_store() == nullptr) {
            lost("is on the disk level, and this server has none");
          } else if (!spill_->HasDiskPage(entry.disk_key)) {
            lost(absl::StrCat("is on the disk level under key ", entry.disk_key,
                              ", which disk_level.dir does not hold"));
          }
          if (why.empty()) {
            below_keys.push_back(entry.disk_key);
            pages.push_back(kPageBelow);
            layer.page_sums.push_back(entry.checksum);
          }
          continue;
        }
        if (entry.kind == SnapshotReader::PageEntry::kHost) {
          uint8_t* dst = nullptr;
          if (why.empty()) {
            absl::StatusOr<uint64_t> slot =
                spill_ != nullptr ? spill_->TakeHostSlot() : absl::FailedPreconditionError("this server has none");
            if (slot.ok()) {
              host_slots.push_back(*slot);
              dst = spill_->HostSlot(*slot);
            } else {
              lost(absl::StrCat("was on the host level, which has no room for it: ", slot.status().message()));
            }
          }
          PageChecksum stored = 0;
          bool intact = true;
          read_page(dst, &stored, &intact);
          if (!framing.ok()) break;
          if (why.empty()) {
            below_keys.push_back(host_slots.back());
            pages.push_back(kPageBelow);
            layer.page_sums.push_back(stored);
          }
          continue;
        }
        if (entry.kind == SnapshotReader::PageEntry::kShared) {
          const uint64_t ordinal = entry.ordinal;
          const PageId src = restored.page(ordinal);
          if (src == SnapshotPagesRestored::kNone) {
            lost("repeats a page that was not restored");
          } else if (why.empty() && pool_->partition_of(src) == device) {
            pool_->Retain({src});
            pages.push_back(src);
            layer.page_sums.push_back(restored.checksum(ordinal));
          } else if (why.empty()) {
            // Held on another device's partition: a copy of its own.
            absl::StatusOr<std::vector<PageId>> one = pool_->Reserve(1, device);
            if (!one.ok()) {
              lost(absl::StrCat("has no room: ", one.status().message()));
            } else {
              std::memcpy(pool_->page((*one)[0]), pool_->page(src), pool_->page_stride());
              pages.push_back((*one)[0]);
              layer.page_sums.push_back(restored.checksum(ordinal));
            }
          }
          ++summary->shared_pages;
          continue;
        }
        PageId dst_page = SnapshotPagesRestored::kNone;
        if (why.empty()) {
          absl::StatusOr<std::vector<PageId>> one = pool_->Reserve(1, device);
          if (one.ok()) {
            dst_page = (*one)[0];
            pages.push_back(dst_page);
          } else {
            why = std::string(one.status().message());
          }
        }
        PageChecksum stored = 0;
        bool intact = true;
        read_page(dst_page != SnapshotPagesRestored::kNone ? pool_->page(dst_page) : nullptr, &stored, &intact);
        if (!framing.ok()) break;
        restored.Full(intact ? dst_page : SnapshotPagesRestored::kNone, stored);
        if (dst_page != SnapshotPagesRestored::kNone) layer.page_sums.push_back(stored);
      }
      bool digests_intact = false;
      if (with_digests && framing.ok()) {
        framing = (*reader)->Digests(static_cast<uint64_t>(h.pages) * p, &digests, &digests_intact);
        if (framing.ok() && !digests_intact) {
          Log(absl::StrCat("the token digests of layer ", l, " of sequence_id ", Quoted(id),
                           " fail their checksum; its paged tokens are restored without them (repeats not compared)"));
        }
      }
      held += static_cast<int64_t>(pages.size());
      for (PageId page : pages) {
        if (page != kPageBelow) reserved.push_back(page);
      }
      if (why.empty()) {
        layer.pages = std::move(pages);
        // One digest per paged token; kNoDigest (not compared on repeat)
        // where the snapshot has none (before version 3, or a failed
        // CRC), so digests stay aligned with token positions.
        if (digests_intact) {
          layer.digests = digests;
        } else {
          layer.digests.assign(static_cast<size_t>(h.pages) * p, kNoDigest);
        }
      }
      layer.window_keys = keys;
      layer.window_values = values;
      // The file's window CRC vouched for these bytes (a failing one drops
      // the sequence): from here each token carries its own.
      layer.window_sums.resize(h.window_tokens);
      for (uint32_t t = 0; t < h.window_tokens; ++t) {
        layer.window_sums[t] = WindowTokenSum(&keys[t * n], &values[t * n], n);
      }
      layer.length = static_cast<int64_t>(h.length);
    }
    if (!framing.ok()) {
      pool_->Free(reserved);
      if (!host_slots.empty()) spill_->GiveHostSlots(host_slots);
      drop(id, "the snapshot ends in a corrupt record");
      break;
    }
    if (why.empty()) {
      if (absl::Status st = table_->Adopt(seq, held); !st.ok()) why = std::string(st.message());
    }
    if (why.empty()) {
      const std::vector<PageId> upload = restored.NotUploaded(reserved);
      if (absl::Status st = backend_->UploadPages(upload); !st.ok()) {
        table_->Unadopt(seq, held);
        why = std::string(st.message());
      } else {
        restored.Uploaded(upload);
      }
    }
    if (!why.empty()) {
      pool_->Free(reserved);
      if (!host_slots.empty()) spill_->GiveHostSlots(host_slots);
      drop(id, why);
      continue;
    }
    if (!below_keys.empty()) {
      absl::MutexLock seq_lock(&seq->mu);
      const bool on_host = *level == SnapshotReader::PageEntry::kHost;
      (on_host ? summary->pages_on_host : summary->pages_on_disk) += below_keys.size();
      spill_->AdoptBelow(*seq, on_host, std::move(below_keys));
    }
    table_->Touch(seq.get());
    for (const LayerState& layer : seq->layers) {
      table_->CountTokens(static_cast<int64_t>(layer.pages.size()) * p,
                          static_cast<int64_t>(layer.window_keys.size() / n));
    }
    summary->pages += static_cast<uint64_t>(held);
    ++summary->sequences;
    seq->usage->CountRestore();
    metrics_->snapshot_restored_sequences->Increment();
  }
  if (framing.ok()) framing = LoadIndexAndPins(reader->get(), &restored, summary);
  // Records no restored sequence names: those of sequences dropped above,
  // and erases the last process left queued.
  if (spill_ != nullptr) summary->disk_records_erased = spill_->EraseUnclaimed();
  // Pages restored for sequences that were then dropped, and repeated by
  // none kept (nor by the index or a pin), go back to the pool.
  restored.Release();
  if (!framing.ok()) {
    summary->rest_lost = true;  // how many sequences followed is unknown
    Log(absl::StrCat("the rest of ", path, " is lost: ", framing.message()));
  }
  PublishGauges();
  reader->reset();
  // Loaded once: a later start without a drain must not bring back what
  // this server is about to change or release.
  const std::string loaded = path + ".loaded";
  if (std::rename(path.c_str(), loaded.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot rename ", path, " to ", loaded));
  }
  return absl::OkStatus();
}

absl::Status Handler::ReadRestoredPage(SnapshotReader* reader, SnapshotPagesRestored* restored, PageId* page,
                                       PageChecksum* sum, SnapshotSummary* summary) {
  *page = SnapshotPagesRestored::kNone;
  bool shared = false;
  uint64_t ordinal = 0;
  absl::Status framing = reader->NextPageKind(&shared, &ordinal);
  if (!framing.ok()) return framing;
  if (shared) {
    // Wherever it lies: the index and pins hold pages of any partition.
    ++summary->shared_pages;
    *sum = restored->checksum(ordinal);
    *page = restored->page(ordinal);
    if (*page != SnapshotPagesRestored::kNone) pool_->Retain({*page});
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<PageId>> one = pool_->Reserve(1, 0);
  std::vector<uint8_t> scratch;
  uint8_t* dst;
  if (one.ok()) {
    dst = pool_->page((*one)[0]);
  } else {
    scratch.resize(pool_->page_stride());
    dst = scratch.data();
  }
  bool intact = true;
  framing = reader->Page(pool_->page_stride(), dst, sum, &intact);
  const bool kept = framing.ok() && one.ok() && intact;
  if (framing.ok() && !intact) {
    ++summary->corrupt_pages;
    ++totals_.snapshot_corrupt_pages;
    metrics_->snapshot_corrupt_pages->Increment();
    verifier_->CountFailure(kCheckSnapshot);
  }
  if (framing.ok()) restored->Full(kept ? (*one)[0] : SnapshotPagesRestored::kNone, *sum);
  if (kept) {
    *page = (*one)[0];  // the Reserve's reference is the caller's
  } else if (one.ok()) {
    pool_->Free(*one);
  }
  return framing;
}

absl::Status Handler::LoadIndexAndPins(SnapshotReader* reader, SnapshotPagesRestored* restored,
                                       SnapshotSummary* summary) {
  // Everything is read first, then uploaded, then entered: an upload that
  // fails enters nothing.
  struct Entry {
    PageKey ns, key;
    int layer = 0;
    PrefixIndex::Page page;
  };
  struct Pinned {
    SnapshotReader::PinHeader header;
    std::vector<PageId> pages;
  };
  std::vector<Entry> entries;
  std::vector<Pinned> pins;
  std::vector<PageId> held;  // every reference taken below
  auto give_back = [&] { pool_->Free(held); };
  const int64_t p = pool_->page_tokens();
  uint64_t lost = 0;
  std::vector<uint64_t> digests;
  for (uint64_t i = 0; i < reader->index_entries(); ++i) {
    SnapshotReader::IndexHeader e;
    absl::Status framing = reader->NextIndexEntry(&e);
    PageId page = SnapshotPagesRestored::kNone;
    PageChecksum sum = 0;
    if (framing.ok()) framing = ReadRestoredPage(reader, restored, &page, &sum, summary);
    bool intact = false;
    if (framing.ok()) framing = reader->Digests(static_cast<uint64_t>(p), &digests, &intact);
    Entry entry;
    const bool kept = framing.ok() && page != SnapshotPagesRestored::kNone && PageKey::FromBytes(e.ns, &entry.ns) &&
                      PageKey::FromBytes(e.key, &entry.key) && e.layer < static_cast<uint32_t>(options_.layers);
    if (!kept && page != SnapshotPagesRestored::kNone) pool_->Free({page});
    if (!framing.ok()) {
      give_back();
      return framing;
    }
    if (!kept) {
      ++lost;  // never served from a page that failed its checksum
      continue;
    }
    held.push_back(page);
    if (!intact) digests.assign(static_cast<size_t>(p), kNoDigest);
    entry.layer = static_cast<int>(e.layer);
    entry.page = PrefixIndex::Page{page, sum, digests};
    entries.push_back(std::move(entry));
  }
  uint64_t count = 0;
  if (absl::Status framing = reader->BeginPins(&count); !framing.ok()) {
    give_back();
    return framing;
  }
  for (uint64_t i = 0; i < count; ++i) {
    Pinned pin;
    if (absl::Status framing = reader->NextPin(&pin.header); !framing.ok()) {
      give_back();
      return framing;
    }
    bool whole = true;
    for (uint32_t k = 0; k < pin.header.pages; ++k) {
      PageId page = SnapshotPagesRestored::kNone;
      PageChecksum sum = 0;
      if (absl::Status framing = ReadRestoredPage(reader, restored, &page, &sum, summary); !framing.ok()) {
        pool_->Free(pin.pages);
        give_back();
        return framing;
      }
      if (page == SnapshotPagesRestored::kNone) {
        whole = false;
      } else {
        pin.pages.push_back(page);
      }
    }
    std::string problem = whole ? KeyProblem(pin.header.key, true, options_.tokens != nullptr)
                                : std::string("a page of it failed its checksum");
    if (!problem.empty()) {
      pool_->Free(pin.pages);
      Log(absl::StrCat("pin_id ", Quoted(pin.header.pin_id), " not restored: ", problem));
      continue;
    }
    held.insert(held.end(), pin.pages.begin(), pin.pages.end());
    pins.push_back(std::move(pin));
  }
  if (absl::Status framing = reader->Finish(); !framing.ok()) {
    give_back();
    return framing;
  }
  if (lost > 0) Log(absl::StrCat(lost, " prefix index entries not restored: their page failed its checksum"));
  // `held` is every page of the entries and pins kept.
  const std::vector<PageId> upload = restored->NotUploaded(held);
  if (absl::Status st = backend_->UploadPages(upload); !st.ok()) {
    Log(absl::StrCat("the prefix index and the pins are not restored: their pages did not reach the backend: ",
                     st.message()));
    give_back();
    return absl::OkStatus();
  }
  restored->Uploaded(upload);
  // The references taken above go to the index and the pins (each takes
  // over one), so `held` is not given back from here on.
  for (Entry& e : entries) {
    index_->Insert(e.ns, e.layer, PageKeyRoot(), {e.key}, {std::move(e.page)});
    ++summary->index_entries;
  }
  const absl::Time now = clock_();
  for (Pinned& pin : pins) {
    PinTable::Placed placed;
    const std::string& key = pin.header.key;
    absl::Status st = pins_->Put(key, pin.header.pin_id, table_->Usage(TenantOfKey(key)), std::move(pin.pages),
                                 static_cast<int64_t>(pool_->page_stride()), now,
                                 now + absl::Nanoseconds(static_cast<int64_t>(pin.header.nanoseconds_left)), &placed);
    if (!st.ok()) {
      Log(absl::StrCat("pin_id ", Quoted(pin.header.pin_id), " not restored: ", st.message()));
      continue;
    }
    ++summary->pins;
  }
  return absl::OkStatus();
}

}  // namespace driftkv
