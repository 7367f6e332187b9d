// A minimal HTTP/1.0 GET over a loopback socket, for scraping /metrics in
// tests without an HTTP client library.
#ifndef DRIFTKV_TESTS_SERVICE_HTTP_H_
#define DRIFTKV_TESTS_SERVICE_HTTP_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace driftkv {
namespace testing {

// The whole response (status line, headers, body), or "" on failure.
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t r; (r = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, r);
    }
  }
  close(fd);
  return out;
}

// The value of the first sample line starting with `series` (name plus
// labels, e.g. driftkv_symbols_coded_total{stream="key"}), or -1.
inline double MetricValue(const std::string& text, const std::string& series) {
  size_t at = 0;
  while ((at = text.find(series, at)) != std::string::npos) {
    if ((at == 0 || text[at - 1] == '\n') && text[at + series.size()] == ' ') {
      return std::stod(text.substr(at + series.size() + 1));
    }
    at += series.size();
  }
  return -1;
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_SERVICE_HTTP_H_
