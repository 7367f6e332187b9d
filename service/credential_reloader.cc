#include "service/credential_reloader.h"

#include <sys/stat.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "prometheus/family.h"
#include "service/quoted.h"
#include "service/tenant_quotas.h"

namespace driftkv {
namespace {

std::vector<std::string> TlsPaths(const ServiceOptions& o) {
  if (!o.tls()) return {};
  std::vector<std::string> paths = {o.tls_cert_file, o.tls_key_file};
  if (o.client_certificates()) paths.push_back(o.tls_client_ca_file);
  return paths;
}

}  // namespace

CredentialReloader::CredentialReloader(const ServiceOptions& options, TokenStore* tokens,
                                       CertificateSource* certificates, prometheus::Registry& registry)
    : options_(options), tokens_(tokens), certificates_(certificates), tls_paths_(TlsPaths(options)) {
  prometheus::Family<prometheus::Counter>& family =
      prometheus::BuildCounter()
          .Name("driftkv_credential_reloads_total")
          .Help("Reloads of tokens_file and of the TLS files (SIGHUP or the watch), taken or refused")
          .Register(registry);
  tokens_ok_ = &family.Add({{"file", "tokens_file"}, {"outcome", "ok"}});
  tokens_failed_ = &family.Add({{"file", "tokens_file"}, {"outcome", "failed"}});
  tls_ok_ = &family.Add({{"file", "tls"}, {"outcome", "ok"}});
  tls_failed_ = &family.Add({{"file", "tls"}, {"outcome", "failed"}});
  absl::MutexLock lock(&mu_);
  if (tokens_ != nullptr) Changed({options_.tokens_file}, &tokens_stamps_);
  if (certificates_ != nullptr) Changed(tls_paths_, &tls_stamps_);
}

CredentialReloader::Stamp CredentialReloader::StampOf(const std::string& path) {
  struct stat st;
  Stamp s;
  if (::stat(path.c_str(), &st) != 0) return s;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return s;
}

bool CredentialReloader::Changed(const std::vector<std::string>& paths, std::vector<Stamp>* last) {
  std::vector<Stamp> now;
  for (const std::string& p : paths) now.push_back(StampOf(p));
  if (now == *last) return false;
  *last = std::move(now);
  return true;
}

void CredentialReloader::Log(const std::string& line) {
  std::cerr << "driftkv-server: reload: " << ForLog(line) << std::endl;
}

absl::Status CredentialReloader::ReloadTokens() {
  absl::StatusOr<TokenTable> table = ReadTokensFile(options_.tokens_file, options_.client_certificates());
  if (!table.ok()) {
    tokens_failed_->Increment();
    Log(absl::StrCat("tokens_file ", options_.tokens_file,
                     " refused, the tokens in force stay: ", table.status().message()));
    return table.status();
  }
  // The tenants' shares of max_sequences and of the NCCL channels follow
  // the file's tenants: a file whose limits break the guarantee is refused
  // as it would be at a start.
  absl::StatusOr<TenantQuota> defaults = ResolveTenantDefaults(options_.tenant_settings, &*table, options_.tokens_file,
                                                               options_.max_sequences, options_.nccl_max_channels);
  if (!defaults.ok()) {
    tokens_failed_->Increment();
    Log(absl::StrCat("tokens_file ", options_.tokens_file,
                     " refused, the tokens in force stay: ", defaults.status().message()));
    return defaults.status();
  }
  const size_t n = table->size();
  tokens_->Replace(std::make_shared<const TokenTable>(*std::move(table)), *defaults);
  tokens_ok_->Increment();
  Log(absl::StrCat("tokens_file ", options_.tokens_file, " taken: ", n, " tokens"));
  return absl::OkStatus();
}

absl::Status CredentialReloader::ReloadTls() {
  absl::StatusOr<TlsFiles> files =
      ReadTlsFiles(options_.tls_cert_file, options_.tls_key_file, options_.tls_client_ca_file);
  if (!files.ok()) {
    tls_failed_->Increment();
    Log(absl::StrCat("TLS files refused, the certificate, key and client CA in force stay: ",
                     files.status().message()));
    return files.status();
  }
  certificates_->Replace(*std::move(files));
  tls_ok_->Increment();
  Log(absl::StrCat("TLS files taken (", absl::StrJoin(tls_paths_, ", "), "); new connections use them"));
  return absl::OkStatus();
}

absl::Status CredentialReloader::ReloadAll() {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  if (tokens_ != nullptr) {
    Changed({options_.tokens_file}, &tokens_stamps_);
    first.Update(ReloadTokens());
  }
  if (certificates_ != nullptr) {
    Changed(tls_paths_, &tls_stamps_);
    first.Update(ReloadTls());
  }
  return first;
}

absl::Status CredentialReloader::ReloadChanged() {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  // A set that failed is not retried until one of its files changes again
  // (one log line per bad edit, not one per look).
  if (tokens_ != nullptr && Changed({options_.tokens_file}, &tokens_stamps_)) first.Update(ReloadTokens());
  if (certificates_ != nullptr && Changed(tls_paths_, &tls_stamps_)) first.Update(ReloadTls());
  return first;
}

}  // namespace driftkv
