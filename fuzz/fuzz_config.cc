// libFuzzer: the server config parser: text format to ServerConfig to
// ResolveConfig; any text gives options or an error naming the field.
// transforms_file is cleared (the file reader has its own target, and a
// fuzzer must not open arbitrary paths).
#include <string>

#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "service/config.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::ServerConfig config;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowPartialMessage(true);
  struct Quiet : google::protobuf::io::ErrorCollector {
    void AddError(int, int, const std::string&) override {}
  } quiet;
  parser.RecordErrorsTo(&quiet);
  if (!parser.ParseFromString(std::string(reinterpret_cast<const char*>(data), size), &config)) return 0;
  config.mutable_codec()->clear_transforms_file();
  absl::StatusOr<ServiceOptions> options = ResolveConfig(config);
  if (options.ok() && options->layers < 1) __builtin_trap();
  return 0;
}
