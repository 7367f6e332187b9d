#include "service/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "wire/text_file.h"

namespace driftkv {
namespace {

struct FreeBio {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct FreeX509 {
  void operator()(X509* x) const { X509_free(x); }
};
struct FreeKey {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, FreeBio>;
using Cert = std::unique_ptr<X509, FreeX509>;
using Key = std::unique_ptr<EVP_PKEY, FreeKey>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM bundle and how many it holds; OpenSSL's
// error queue is cleared (its end-of-file "error" included).
Cert FirstCertificate(const std::string& pem, int* count) {
  Bio bio = MemoryBio(pem);
  Cert first;
  *count = 0;
  while (Cert c = Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))) {
    if (++*count == 1) first = std::move(c);
  }
  ERR_clear_error();
  return first;
}

absl::Status Invalid(const char* field, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", path, ": ", what));
}

}  // namespace

absl::StatusOr<TlsFiles> ReadTlsFiles(const std::string& cert_file, const std::string& key_file,
                                      const std::string& ca_file) {
  TlsFiles f;
  absl::StatusOr<std::string> text = ReadNonEmptyFile(cert_file, "tls_cert_file");
  if (!text.ok()) return text.status();
  f.cert_chain = *std::move(text);
  text = ReadNonEmptyFile(key_file, "tls_key_file");
  if (!text.ok()) return text.status();
  f.private_key = *std::move(text);

  int count = 0;
  Cert leaf = FirstCertificate(f.cert_chain, &count);
  if (leaf == nullptr) return Invalid("tls_cert_file", cert_file, "holds no PEM certificate");
  if (X509_cmp_current_time(X509_get0_notAfter(leaf.get())) < 0) {
    return Invalid("tls_cert_file", cert_file, "the certificate has expired");
  }
  Bio key_bio = MemoryBio(f.private_key);
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) return Invalid("tls_key_file", key_file, "holds no PEM private key (or an encrypted one)");
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    ERR_clear_error();
    return Invalid("tls_key_file", key_file, absl::StrCat("is not the private key of the certificate in ", cert_file));
  }
  if (!ca_file.empty()) {
    text = ReadNonEmptyFile(ca_file, "tls_client_ca_file");
    if (!text.ok()) return text.status();
    f.client_ca = *std::move(text);
    if (FirstCertificate(f.client_ca, &count) == nullptr) {
      return Invalid("tls_client_ca_file", ca_file, "holds no PEM certificate");
    }
  }
  return f;
}

}  // namespace driftkv
