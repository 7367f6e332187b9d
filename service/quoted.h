// How the service writes a client's strings (a sequence_id, a table key, a
// region name) into error messages and logs: never raw, since a client
// chooses every byte of them. One helper for both, so that a log line can
// hold no forged newline, terminal escape or NUL.
#ifndef DRIFTKV_SERVICE_QUOTED_H_
#define DRIFTKV_SERVICE_QUOTED_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace driftkv {

// In double quotes, escaped: printable ASCII as given, quote and
// backslash backslashed, every other byte (control bytes, NUL, 0x7f and
// bytes >= 0x80, so UTF-8 too) as \xNN, always two digits: "\0alice" is
// written "\x00alice".
inline std::string Quoted(absl::string_view id) {
  std::string out = "\"";
  out.reserve(id.size() + 2);
  for (const char c : id) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20 || u >= 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

// A line that may carry a client's text (an error message): control bytes
// (< 0x20, 0x7f) as \xNN, everything else as is (messages quote ids with
// Quoted already).
inline std::string ForLog(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_QUOTED_H_
