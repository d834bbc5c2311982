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
#include <utility>
#include <vector>

namespace moec {

struct Comparison {
  int failures = 0;
  int lines = 0;
  std::map<std::string, std::vector<float>> ours; // for --dump

  /// relTolerance > 0: ||a-b||/||b|| against it; else max abs error against absTolerance.
  bool bf16 = false; // every check is relative 2e-2, or what `spread` allows

  /// bf16 with transformers' own bf16 run of the recipe (moe-align --bf16-spread): its relative
  /// distance from the reference per tensor name. A tensor's tolerance is then the largest of
  /// 2e-2, twice that distance, and twice the median distance over the tensors of its kind
  /// (kindOf): transformers' bf16 arithmetic is as far from the exact function as that, so a
  /// check stricter than twice its noise would fail the reference itself (docs/alignment.md).
  std::map<std::string, double> spread;

  static std::string kindOf(const std::string &name) {
    for (const char *prefix : {"lora.grad.", "lora.after3."})
      if (name.rfind(prefix, 0) == 0)
        return prefix;
    return "forward";
  }

  /// Transformers' bf16 distance for `name` and the median over its kind; {0, 0} without one.
  std::pair<double, double> spreadOf(const std::string &name) const {
    auto found = spread.find(name);
    if (found == spread.end())
      return {0, 0};
    std::vector<double> sameKind;
    for (const auto &[other, distance] : spread)
      if (kindOf(other) == kindOf(name))
        sameKind.push_back(distance);
    std::nth_element(sameKind.begin(), sameKind.begin() + sameKind.size() / 2, sameKind.end());
    return {found->second, sameKind[sameKind.size() / 2]};
  }

  /// ||a - b|| / ||b|| (same sizes).
  static double relative(const std::vector<float> &a, const std::vector<float> &b) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < b.size(); ++i) {
      double d = static_cast<double>(a[i]) - b[i];
      diff += d * d;
      norm += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  }

  /// `name` may carry a remark after " (", which the spread's lookup ignores.
  void check(const std::string &name, const std::vector<float> &ours, const std::vector<float> &ref,
             double relTolerance, double absTolerance) {
    std::pair<double, double> noise{0, 0}; // (this tensor, its kind's median) when they widen it
    if (bf16) {
      relTolerance = 2e-2;
      absTolerance = 0;
      std::pair<double, double> found = spreadOf(name.substr(0, name.find(" (")));
      if (2 * std::max(found.first, found.second) > relTolerance) {
        noise = found;
        relTolerance = 2 * std::max(found.first, found.second);
      }
    }
    ++lines;
    this->ours[name] = ours;
    if (ours.size() != ref.size() || ref.empty()) {
      std::printf("%-90s  size %zu vs reference %zu  FAIL\n", name.c_str(), ours.size(), ref.size());
      ++failures;
      return;
    }
    double maxAbs = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      maxAbs = std::max(maxAbs, std::abs(static_cast<double>(ours[i]) - ref[i]));
    double rel = relative(ours, ref);
    bool pass = std::isfinite(maxAbs) && (relTolerance > 0 ? rel <= relTolerance : maxAbs <= absTolerance);
    failures += pass ? 0 : 1;
    if (noise.first > 0 || noise.second > 0)
      std::printf("%-90s  max_abs %.3e  rel %.3e  %s (tolerance %.1e: transformers' bf16 %.1e, its kind's "
                  "median %.1e)\n",
                  name.c_str(), maxAbs, rel, pass ? "PASS" : "FAIL", relTolerance, noise.first, noise.second);
    else
      std::printf("%-90s  max_abs %.3e  rel %.3e  %s\n", name.c_str(), maxAbs, rel, pass ? "PASS" : "FAIL");
  }
};

} // namespace moec

#endif // TESTS_GOLDEN_COMPARISON_H_
