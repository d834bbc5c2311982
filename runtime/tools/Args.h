//===- Args.h - command-line flags of the runtime tools ---------*- C++ -*-===//
//
// `--name value`, `--name=value`, `--flag`, `-o value`, positionals. Flags a
// tool never asks for are reported (typos fail instead of being ignored).
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TOOLS_ARGS_H_
#define RUNTIME_TOOLS_ARGS_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace moec::runtime {

class Args {
public:
  Args(int argc, char **argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg.rfind("--", 0) != 0 && arg != "-o") {
        positional.push_back(arg);
        continue;
      }
      std::string name = arg == "-o" ? "o" : arg.substr(2), value;
      if (size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        value = argv[++i];
      } else {
        value = "true";
      }
      values[name] = value;
    }
  }
  std::string get(const std::string &name, const std::string &otherwise = "") {
    used.insert(name);
    auto it = values.find(name);
    return it == values.end() ? otherwise : it->second;
  }
  /// Replaces a flag's value (a launcher handing its ranks a resolved choice).
  void set(const std::string &name, const std::string &value) { values[name] = value; }
  bool has(const std::string &name) {
    used.insert(name);
    return values.count(name) > 0;
  }
  /// A non-negative integer flag; errors name the flag.
  bool integer(const std::string &name, int64_t otherwise, int64_t &out, std::string &error) {
    std::string text = get(name);
    if (text.empty()) {
      out = otherwise;
      return true;
    }
    char *end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (*end != '\0' || v < 0) {
      error = "--" + name + " expects a non-negative integer, got '" + text + "'";
      return false;
    }
    out = v;
    return true;
  }
  /// A boolean flag: absent = false; `--flag`, `--flag true` or `--flag=true` = true;
  /// `false` = false; anything else is an error naming the flag.
  bool flag(const std::string &name, bool &out, std::string &error) {
    std::string text = get(name, "false");
    if (text != "true" && text != "false") {
      error = "--" + name + " takes no value (or true/false), got '" + text + "'";
      return false;
    }
    out = text == "true";
    return true;
  }
  /// Flags given but never asked for: typos.
  std::vector<std::string> unknown() const {
    std::vector<std::string> out;
    for (const auto &[name, value] : values)
      if (!used.count(name))
        out.push_back(name == "o" ? "-o" : "--" + name);
    return out;
  }
  std::vector<std::string> positional;

private:
  std::map<std::string, std::string> values;
  std::set<std::string> used;
};

} // namespace moec::runtime

#endif // RUNTIME_TOOLS_ARGS_H_
