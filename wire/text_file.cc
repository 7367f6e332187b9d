#include "wire/text_file.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace driftkv {

absl::StatusOr<std::string> ReadNonEmptyFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", path, "\" cannot be read or is empty"));
  }
  return text.str();
}

}  // namespace driftkv
