// A client process for tests/doorbell_test.cc: registers one host region
// (no background renewal), opens a doorbell in it, prints the doorbell id
// and exits with _exit, closing nothing: a client that died.
//   doorbell_client_helper TARGET CA_FILE TOKEN LEASE_SECONDS NAME
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "client/doorbell.h"
#include "client/regions.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s TARGET CA_FILE TOKEN LEASE_SECONDS NAME\n", argv[0]);
    return 2;
  }
  driftkv::ClientOptions o;
  o.target = argv[1];
  o.tls_ca_file = argv[2];
  o.token = argv[3];
  o.max_attempts = 1;
  o.timeout = absl::Seconds(10);
  driftkv::Client client(o);
  driftkv::HostRegionOptions ro;
  ro.lease_seconds = static_cast<uint32_t>(std::atoi(argv[4]));
  ro.name = argv[5];
  ro.renew_in_background = false;
  auto region = driftkv::HostRegion::Create(&client, driftkv::DoorbellClient::Bytes(4096, 4096), ro);
  if (!region.ok()) {
    std::fprintf(stderr, "%s\n", region.status().ToString().c_str());
    return 1;
  }
  auto bell = driftkv::DoorbellClient::Open(&client, region->get(), 0, 4096, 4096);
  if (!bell.ok()) {
    std::fprintf(stderr, "%s\n", bell.status().ToString().c_str());
    return 1;
  }
  std::printf("%llu\n", static_cast<unsigned long long>((*bell)->id()));
  std::fflush(stdout);
  _exit(0);
}
