// How error messages of the service quote a client's identifier (a
// sequence_id, a table key): in double quotes, as given.
#ifndef DRIFTKV_SERVICE_QUOTED_H_
#define DRIFTKV_SERVICE_QUOTED_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace driftkv {

inline std::string Quoted(const std::string& id) {
  return absl::StrCat("\"", id, "\"");
}

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_QUOTED_H_
