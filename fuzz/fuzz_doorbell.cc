// libFuzzer: ServeDoorbellRequest (service/doorbell.h) over doorbell memory
// the input fills. The first two bytes pick the request and response
// capacities (64 to 512 bytes each); the rest is the doorbell's memory
// (wire/doorbell.h: client line, server line, request area, response
// area), zero-padded or cut to exactly its size, in a heap block of that
// size (ASan: nothing may be read or written outside it). The request, of
// any kind (an AttendRequest, one to prepare, a prepared slot to answer),
// is answered by a real Handler (fuzz/fuzz_handler.h); prepared slots
// persist from input to input, as they do on a doorbell. After it the server
// line must say: response_seq = the request_seq served, response_bytes
// within the response capacity, a valid status code; on OK the response
// area parses as an AttendResponse.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz/fuzz_handler.h"
#include "service/doorbell.h"
#include "wire/doorbell.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint64_t c = 64 * (1 + data[0] % 8), r = 64 * (1 + data[1] % 8);
  data += 2;
  size -= 2;
  const uint64_t bytes = doorbell::Bytes(c, r);
  std::unique_ptr<uint8_t[]> memory(new uint8_t[bytes]);
  std::memset(memory.get(), 0, bytes);
  std::memcpy(memory.get(), data, size < bytes ? size : bytes);
  uint8_t* base = memory.get();
  const auto* client = reinterpret_cast<const doorbell::ClientLine*>(base + doorbell::kClientLine);
  const auto* server = reinterpret_cast<const doorbell::ServerLine*>(base + doorbell::kServerLine);
  const uint64_t seq = client->request_seq;
  // Reused across inputs, as a doorbell thread reuses it across requests.
  static DoorbellScratch scratch;
  ServeDoorbellRequest(base, c, r, seq, fuzz::FuzzAttend, "", &scratch);
  if (server->response_seq != seq || server->response_word != static_cast<uint32_t>(seq)) __builtin_trap();
  if (server->response_bytes > r) __builtin_trap();
  if (server->code < 0 || server->code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) __builtin_trap();
  if (server->code == 0) {
    v1::AttendResponse response;
    if (!response.ParseFromArray(base + doorbell::kHeaderBytes + c, static_cast<int>(server->response_bytes))) {
      __builtin_trap();
    }
  }
  return 0;
}
