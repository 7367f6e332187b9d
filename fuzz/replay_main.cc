// A main for the fuzz targets outside libFuzzer (builds without
// --config=fuzz, and the corpus tests): calls LLVMFuzzerTestOneInput once
// per file named on the command line, or per file inside a folder named
// there (not recursively), in name order. Exits 1 when no input was found,
// so that a corpus test over a missing or empty corpus fails instead of
// passing vacuously. A target that finds a bug aborts or traps itself.
//
//   fuzz_TARGET FILE_OR_DIR...
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The regular files of `path`: itself, or the entries of the folder.
std::vector<std::string> Inputs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> files;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return {};
  while (const dirent* entry = readdir(dir)) {
    const std::string file = path + "/" + entry->d_name;
    if (stat(file.c_str(), &st) == 0 && S_ISREG(st.st_mode)) files.push_back(file);
  }
  closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const std::string& file : Inputs(argv[i])) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        std::fprintf(stderr, "cannot read %s\n", file.c_str());
        return 1;
      }
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  std::fprintf(stderr, "%d input(s) replayed\n", replayed);
  return replayed > 0 ? 0 : 1;
}
