// A driftkv-server process for the tests that need a real one (drain and
// restart, soak): spawned with its output in a log file, its gRPC port
// read from the "listening on port N" line, killed on destruction.
#ifndef DRIFTKV_TESTS_SERVER_PROCESS_H_
#define DRIFTKV_TESTS_SERVER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/time/clock.h"

extern char** environ;

namespace driftkv {
namespace testing {

inline std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log;

  // Starts SERVER --config CONFIG on a loopback port; false if it exits or
  // prints no port within 60 s (a sanitizer build starts slowly).
  bool Start(const std::string& server, const std::string& config, const std::string& log_path) {
    log = log_path;
    std::vector<std::string> args = {server, "--config", config, "--listen", "127.0.0.1:0", "--metrics", "none"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid, server.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return false;
    for (int i = 0; i < 600; ++i) {
      const std::string text = Slurp(log);
      const size_t at = text.find("listening on port ");
      if (at != std::string::npos) {
        port = std::atoi(text.c_str() + at + 18);
        return port > 0;
      }
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }
  // Waits for the exit: its status, or -1 for a signal.
  int Wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Resident set size in KiB (VmRSS), 0 if unreadable.
  long RssKib() const {
    const std::string status = Slurp("/proc/" + std::to_string(pid) + "/status");
    const size_t at = status.find("VmRSS:");
    return at == std::string::npos ? 0 : std::atol(status.c_str() + at + 6);
  }
  ~ServerProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_SERVER_PROCESS_H_
