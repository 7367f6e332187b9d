// A small "--name value" / "--name=value" parser for the command-line tools:
// every flag must be known, every value parsed, and errors name the flag.
// --help (or -h) anywhere prints the tool's usage line (set_usage) and the
// flags it takes to stdout, and exits with status 0.
#ifndef DRIFTKV_EVAL_FLAGS_H_
#define DRIFTKV_EVAL_FLAGS_H_

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace driftkv {

class Flags {
 public:
  // What --help prints above the list of flags.
  void set_usage(std::string usage) { usage_ = std::move(usage); }

  // `known` lists the value flags, `switches` the flags without a value.
  absl::Status Parse(int argc, char** argv, const std::set<std::string>& known, const std::set<std::string>& switches) {
    for (int i = 0; i < argc; ++i) {
      if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") PrintHelpAndExit(known, switches);
    }
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", a, "\""));
      a = a.substr(2);
      std::string value;
      const size_t eq = a.find('=');
      bool has_value = eq != std::string::npos;
      if (has_value) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
      }
      if (switches.count(a)) {
        if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", a, " takes no value"));
        values_[a] = "1";
        continue;
      }
      if (!known.count(a)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", a));
      if (!has_value) {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", a, " needs a value"));
        value = argv[++i];
      }
      values_[a] = value;
    }
    return absl::OkStatus();
  }

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Str(const std::string& name, const std::string& def = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  template <typename T>
  absl::Status Num(const std::string& name, T* out) const {
    auto it = values_.find(name);
    if (it == values_.end()) return absl::OkStatus();
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      ok = absl::SimpleAtod(it->second, out);
    } else {
      ok = absl::SimpleAtoi(it->second, out);
    }
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("--", name, " \"", it->second, "\" is not a number"));
    return absl::OkStatus();
  }

 private:
  [[noreturn]] void PrintHelpAndExit(const std::set<std::string>& known, const std::set<std::string>& switches) const {
    if (!usage_.empty()) std::printf("%s\n\n", usage_.c_str());
    std::printf("flags:\n");
    for (const std::string& k : known) std::printf("  --%s VALUE\n", k.c_str());
    for (const std::string& k : switches) std::printf("  --%s\n", k.c_str());
    std::exit(0);
  }

  std::string usage_;
  std::map<std::string, std::string> values_;
};

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_FLAGS_H_
