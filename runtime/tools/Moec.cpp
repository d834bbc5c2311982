//===- Moec.cpp - run the compiler from runtime tools ---------------------===//

#include "runtime/tools/Moec.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace fs = std::filesystem;

namespace moec::runtime {

std::string findMoec() {
  if (const char *env = std::getenv("MOEC"))
    return env;
  std::error_code ec;
  fs::path self = fs::canonical("/proc/self/exe", ec);
  if (!ec)
    for (fs::path candidate : {self.parent_path() / "moec", self.parent_path() / "../../compiler/tools/moec",
                               self.parent_path() / "../../../compiler/tools/moec"})
      if (fs::exists(candidate))
        return candidate.string();
  return "moec";
}

namespace {
std::string quoted(const std::string &arg) {
  std::string out = "'";
  for (char c : arg)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
} // namespace

absl::Status runMoecCompile(const std::vector<std::string> &args) {
  std::string command = quoted(findMoec()) + " compile";
  for (const std::string &arg : args)
    command += " " + quoted(arg);
  command += " 2>&1";
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe)
    return absl::InternalError("cannot run " + command);
  std::string output;
  char chunk[4096];
  while (size_t n = fread(chunk, 1, sizeof chunk, pipe))
    output.append(chunk, n);
  int status = pclose(pipe);
  if (status != 0)
    return absl::InternalError(command + " failed" + (output.empty() ? "" : ":\n" + output) +
                               "(set $MOEC to the moec binary, or give a plan)");
  return absl::OkStatus();
}

} // namespace moec::runtime
