// Reloads tokens_file and the TLS files without a restart
// (docs/security.md, "Reloading credentials").
//
// Two triggers: ReloadAll (driftkv-server's SIGHUP) re-reads every
// configured file; ReloadChanged (the watch, every reload_interval_seconds)
// re-reads those whose inode, size or modification time changed since the
// last look, which is what a Kubernetes Secret update does to its mounted
// files (an atomic swap of the ..data link: new inodes).
//
// A file set is taken only whole and only once it passes the checks of a
// start: tokens_file by ReadTokensFile (service/config.h), the certificate,
// key and client CA together by ReadTlsFiles (service/tls_files.h). A file
// that fails is refused with one log line naming it and the error; the
// credentials in force stay, so a bad edit never locks clients out. A
// tokens_file taken replaces the table for the next call (removed tokens
// stop working, added ones start); TLS files taken are handed to gRPC at
// the next handshake (service/credentials.h).
//
// Counts driftkv_credential_reloads_total{file="tokens_file"|"tls",
// outcome="ok"|"failed"} in the server's registry.
#ifndef DRIFTKV_SERVICE_CREDENTIAL_RELOADER_H_
#define DRIFTKV_SERVICE_CREDENTIAL_RELOADER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "service/config.h"
#include "service/credentials.h"
#include "service/token_store.h"

namespace driftkv {

class CredentialReloader {
 public:
  // `tokens` (null: no tokens_file) and `certificates` (null: no TLS) must
  // outlive the reloader. Records the files' current stamps, so the first
  // ReloadChanged reloads only what changed after this.
  CredentialReloader(const ServiceOptions& options, TokenStore* tokens, CertificateSource* certificates,
                     prometheus::Registry& registry);

  // Re-reads every configured file. OK when every set was taken (or none is
  // configured); else the first refusal, each also logged.
  absl::Status ReloadAll();
  // Re-reads the sets with a file whose stamp changed; OK when nothing
  // changed or every changed set was taken.
  absl::Status ReloadChanged();

 private:
  // What the watch compares: st_dev, st_ino, st_size, st_mtim (stat follows
  // links). All zero for a file that cannot be stat'ed.
  struct Stamp {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Stamp& o) const {
      return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  static Stamp StampOf(const std::string& path);
  // The stamps of the files of one set; true when they differ from `*last`,
  // which is updated.
  static bool Changed(const std::vector<std::string>& paths, std::vector<Stamp>* last);

  absl::Status ReloadTokens() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReloadTls() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Log(const std::string& line);

  const ServiceOptions options_;
  TokenStore* const tokens_;
  CertificateSource* const certificates_;
  const std::vector<std::string> tls_paths_;  // cert, key and (when set) client CA
  prometheus::Counter* tokens_ok_;
  prometheus::Counter* tokens_failed_;
  prometheus::Counter* tls_ok_;
  prometheus::Counter* tls_failed_;
  absl::Mutex mu_;  // one reload at a time
  std::vector<Stamp> tokens_stamps_ ABSL_GUARDED_BY(mu_);
  std::vector<Stamp> tls_stamps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CREDENTIAL_RELOADER_H_
