// A whole file as text, for the few small files the client and the server
// read whole (PEM certificates and keys).
#ifndef DRIFTKV_WIRE_TEXT_FILE_H_
#define DRIFTKV_WIRE_TEXT_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace driftkv {

// The file's bytes, or InvalidArgument naming it (`what`: the option or
// config field that named the path) when it cannot be read or is empty.
absl::StatusOr<std::string> ReadNonEmptyFile(const std::string& path, const char* what);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_TEXT_FILE_H_
