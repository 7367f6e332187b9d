// driftkv-server --config FILE [--listen ADDR] [--metrics ADDR] [--backend cpu]
//
// Serves driftkv.v1.KvCache for one model shape. The config is a
// ServerConfig in protobuf text format (deploy/driftkv-server.textproto);
// flags override its fields. SIGINT/SIGTERM drain the server: NOT_SERVING,
// new sequences refused, calls in flight finish, a snapshot written to the
// config's snapshot_dir, exit 0 (docs/reliability.md); started on that
// folder again, the server restores the snapshot before serving. SIGHUP
// re-reads tokens_file and the TLS files (docs/security.md); a file that
// fails its checks is refused and logged, and the server keeps serving.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "service/config.h"
#include "service/process_env.h"
#include "service/server.h"

ABSL_FLAG(std::string, config, "", "ServerConfig text-format file (required)");
ABSL_FLAG(std::string, listen, "", "gRPC address, overrides the config's listen");
ABSL_FLAG(std::string, metrics, "", "Prometheus address, overrides metrics_listen (\"none\": off)");
ABSL_FLAG(std::string, backend, "",
          "compute backend, overrides the config's backend (cpu, or one registered by a linked library, see "
          "backends/registry.h)");
ABSL_FLAG(std::string, devices, "", "devices of a multi-GPU server, e.g. 0,1; overrides the config's devices");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "keep Abseil's Mutex deadlock detector on (costs every lock acquisition an edge per lock held; "
          "the TSan suite checks lock order instead)");

int main(int argc, char** argv) {
  driftkv::PrepareServerProcess();
  absl::InitializeSymbolizer(argv[0]);
  absl::SetProgramUsageMessage("driftkv-server --config FILE [--listen ADDR] [--metrics ADDR] [--backend NAME]");
  // --help lists the server's own flags: this file's and those of the
  // backends it links, not absl's or gRPC's
  // (absl's default matches only a file named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "service/") || absl::StrContains(file, "backends/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  absl::FailureSignalHandlerOptions fsh;
  absl::InstallFailureSignalHandler(fsh);
  // PrepareServerProcess turned Abseil's deadlock detector off.
  if (absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
  }

  const std::string path = absl::GetFlag(FLAGS_config);
  if (path.empty()) {
    std::cerr << "driftkv-server: --config FILE is required\n";
    return 2;
  }
  absl::StatusOr<driftkv::v1::ServerConfig> config = driftkv::LoadConfigFile(path);
  if (!config.ok()) {
    std::cerr << "driftkv-server: " << config.status().message() << "\n";
    return 2;
  }
  if (!absl::GetFlag(FLAGS_listen).empty()) config->set_listen(absl::GetFlag(FLAGS_listen));
  if (!absl::GetFlag(FLAGS_metrics).empty()) config->set_metrics_listen(absl::GetFlag(FLAGS_metrics));
  if (!absl::GetFlag(FLAGS_backend).empty()) config->set_backend(absl::GetFlag(FLAGS_backend));
  if (!absl::GetFlag(FLAGS_devices).empty()) {
    config->clear_devices();
    for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_devices), ',')) {
      uint32_t index = 0;
      if (!absl::SimpleAtoi(d, &index)) {
        std::cerr << "driftkv-server: --devices " << absl::GetFlag(FLAGS_devices) << ": \"" << d
                  << "\" is not a device index\n";
        return 2;
      }
      config->add_devices(index);
    }
  }
  absl::StatusOr<driftkv::ServiceOptions> options = driftkv::ResolveConfig(*config);
  if (!options.ok()) {
    std::cerr << "driftkv-server: invalid config " << path << ": " << options.status().message() << "\n";
    return 2;
  }
  // SIGINT/SIGTERM/SIGHUP are blocked in every thread (the server's threads
  // inherit the mask) and taken synchronously by sigwait below: no signal
  // handler runs.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<std::unique_ptr<driftkv::DriftkvServer>> server = driftkv::DriftkvServer::Start(*options);
  if (!server.ok()) {
    std::cerr << "driftkv-server: " << server.status().message() << "\n";
    return 1;
  }
  // The codec in force: the config's, or a snapshot's payload sizes (kept).
  if (!(*server)->kept_payloads().empty()) std::cerr << "driftkv-server: " << (*server)->kept_payloads() << "\n";
  const std::string quality = driftkv::QualityWarning((*server)->handler().options());
  if (!quality.empty()) std::cerr << "driftkv-server: warning: " << quality << "\n";
  driftkv::v1::InfoResponse info;
  (*server)->handler().Info(&info);
  std::printf(
      "driftkv-server %s: backend %s, %u layers x %u kv_heads x %u head_dim, dquant %.3f/%.3f "
      "bits per key/value, pool %llu pages x %llu bytes (%llu tokens each), window %u tokens, transform %s",
      info.server_version().c_str(), info.backend().c_str(), info.layers(), info.kv_heads(), info.head_dim(),
      info.key_bits_per_value(), info.value_bits_per_value(), static_cast<unsigned long long>(info.capacity_pages()),
      static_cast<unsigned long long>(info.page_bytes()), static_cast<unsigned long long>(info.page_tokens()),
      info.window_tokens(), info.transform().c_str());
  if (info.transform() == "wush") {
    std::printf(" (%s, checksum %016llx, %llu calibration tokens per layer%s)", options->transforms_file.c_str(),
                static_cast<unsigned long long>(info.transforms_checksum()),
                static_cast<unsigned long long>(info.transforms_calibration_tokens()),
                info.values_folded() ? ", values folded" : "");
  }
  const driftkv::Handler::SnapshotSummary& restored = (*server)->restored();
  if (!options->snapshot_dir.empty()) {
    std::printf("\n%s", driftkv::Handler::RestoreReport(options->snapshot_dir, restored).c_str());
  }
  // "listening on port N (gRPC)" starts the line: scripts parse it.
  std::printf("\nlistening on port %d (gRPC)", (*server)->port());
  if (info.tls()) std::printf(" with TLS%s", info.client_certificates() ? " and client certificates" : "");
  if (info.tokens()) std::printf(" and bearer tokens");
  if ((*server)->health_port() != 0) std::printf(", health on port %d (plaintext)", (*server)->health_port());
  if ((*server)->metrics_port() != 0) std::printf(", metrics on port %d (/metrics)", (*server)->metrics_port());
  std::printf("\n");
  std::fflush(stdout);

  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) {
    // The reloader logs what it took and what it refused.
    std::printf("driftkv-server: SIGHUP, reloading tokens_file and TLS files\n");
    std::fflush(stdout);
    (*server)->ReloadCredentials().IgnoreError();
  }
  std::printf("driftkv-server: %s, shutting down: draining (notice %gs, timeout %gs)\n",
              signal == SIGINT ? "SIGINT" : "SIGTERM", options->drain_notice_seconds, options->drain_timeout_seconds);
  std::fflush(stdout);
  driftkv::Handler::SnapshotSummary written;
  absl::Status st = (*server)->Drain(&written);
  if (!st.ok()) {
    std::fprintf(stderr, "driftkv-server: the snapshot was not written: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  if (!options->snapshot_dir.empty()) {
    std::printf("driftkv-server: snapshot of %llu sequences (%llu pages) written to %s; %llu sequences left out\n",
                static_cast<unsigned long long>(written.sequences), static_cast<unsigned long long>(written.pages),
                written.path.c_str(), static_cast<unsigned long long>(written.dropped_sequences));
    if (written.pages_on_host + written.pages_on_disk > 0) {
      std::printf(
          "driftkv-server: of those pages %llu were on the host level (in the file), %llu stay in the disk "
          "level's records\n",
          static_cast<unsigned long long>(written.pages_on_host),
          static_cast<unsigned long long>(written.pages_on_disk));
    }
  }
  std::printf("driftkv-server: drained\n");
  std::fflush(stdout);
  return 0;
}
