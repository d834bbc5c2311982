//===- Comparison.h - one line per compared tensor, and the verdict -*- C++ -*-===//
//
// moe-align and moe-mesh-check print the same lines: name, max abs error,
// relative error ||ours - ref|| / ||ref||, PASS/FAIL.
//
//===----------------------------------------------------------------------===//

#ifndef TESTS_GOLDEN_COMPARISON_H_
#define TESTS_GOLDEN_COMPARISON_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace moec {

struct Comparison {
  int failures = 0;
  int lines = 0;
  std::map<std::string, std::vector<float>> ours; // for --dump

  /// relTolerance > 0: ||a-b||/||b|| against it; else max abs error against absTolerance.
  bool bf16 = false; // every check is relative 2e-2

  void check(const std::string &name, const std::vector<float> &ours, const std::vector<float> &ref,
             double relTolerance, double absTolerance) {
    if (bf16) {
      relTolerance = 2e-2;
      absTolerance = 0;
    }
    ++lines;
    this->ours[name] = ours;
    if (ours.size() != ref.size() || ref.empty()) {
      std::printf("%-90s  size %zu vs reference %zu  FAIL\n", name.c_str(), ours.size(), ref.size());
      ++failures;
      return;
    }
    double maxAbs = 0, diff = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double d = static_cast<double>(ours[i]) - ref[i];
      maxAbs = std::max(maxAbs, std::abs(d));
      diff += d * d;
      norm += static_cast<double>(ref[i]) * ref[i];
    }
    double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
    bool pass = std::isfinite(maxAbs) && (relTolerance > 0 ? rel <= relTolerance : maxAbs <= absTolerance);
    failures += pass ? 0 : 1;
    std::printf("%-90s  max_abs %.3e  rel %.3e  %s\n", name.c_str(), maxAbs, rel, pass ? "PASS" : "FAIL");
  }
};

} // namespace moec

#endif // TESTS_GOLDEN_COMPARISON_H_
