// Warm restarts across the change of D-Quant's default containers for
// n = kv_heads x head_dim below 512 (codec/dquant_codec.h
// DefaultPayloadBytes; docs/api.md "Default containers").
//
// A snapshot's identity records the payload sizes its pages were written
// with (key_payload_bytes, value_payload_bytes; service/snapshot_file.h),
// and Handler::LoadSnapshot loads it only into a server whose identity is
// the same. Releases before the change resolved a config that leaves
// codec.key_bytes / codec.value_bytes unset to LegacyDefaultPayloadBytes;
// the same config now resolves larger payloads below n = 512, so its
// snapshot would be refused and the server would not start.
//
// KeepSnapshotPayloads therefore gives such a config the snapshot's
// payload of a stream (keys, values) when all of these hold:
//   - the config leaves that stream's size unset (a set size is never
//     changed, and a snapshot that disagrees with it is refused as before);
//   - the snapshot's codec is D-Quant with the config's kv_heads, head_dim,
//     levels and alpha;
//   - its size is LegacyDefaultPayloadBytes for them, and not today's
//     default (from n = 512 up the two are the same: nothing happens).
// The pages then load exactly as before, and the snapshots this server
// writes keep those sizes: a deployment keeps its containers across warm
// restarts until codec.key_bytes / value_bytes are set, or the snapshot
// is moved away (and the server starts empty with today's defaults).
// Anything else is left to LoadSnapshot, which compares the identities.
#ifndef DRIFTKV_SERVICE_SNAPSHOT_COMPAT_H_
#define DRIFTKV_SERVICE_SNAPSHOT_COMPAT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "service/config.h"

namespace driftkv {

// Reads the identity of the snapshot in options->snapshot_dir (none, or
// one that cannot be read: nothing is kept, the load reports it) and keeps
// its payloads as above, in options->codec. Returns one line for the log
// naming what was kept and why, or "" when nothing was.
std::string KeepSnapshotPayloads(ServiceOptions* options);

// The same for a snapshot identity already read; `path` names the file in
// the line.
std::string KeepSnapshotPayloads(absl::string_view identity, const std::string& path, ServiceOptions* options);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SNAPSHOT_COMPAT_H_
