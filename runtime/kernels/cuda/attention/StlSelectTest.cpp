//===- StlSelectTest.cpp - the libstdc++ port against std:: (host only) ---===//
//
// The GPU dsa_indexer reproduces the CPU's tie-breaking by running
// StlSelect.h on each row; this checks, without a GPU, that the port
// permutes rows exactly as std::nth_element / std::sort / std::partial_sort
// do (the whole row, not only the selected prefix).
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "runtime/kernels/cuda/attention/StlSelect.h"

namespace moec::runtime::cuda::attention::stl {
namespace {

using Pair = std::pair<float, int64_t>;

bool stdRanksHigher(const Pair &x, const Pair &y) {
  return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
}

/// A row as the CPU builds it: scores with many ties, future keys at -inf.
std::vector<Pair> makeRow(std::mt19937_64 &rng, int64_t n, int64_t last, int distinct) {
  std::vector<Pair> row(static_cast<size_t>(n));
  std::uniform_int_distribution<int> pick(0, distinct - 1);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  for (int64_t s = 0; s < n; ++s) {
    float score = -std::numeric_limits<float>::infinity();
    if (s <= last)
      score = distinct > 0 ? std::max(0.0f, static_cast<float>(pick(rng)) - distinct / 2) * 0.25f
                           : real(rng);
    row[static_cast<size_t>(s)] = {score, s};
  }
  return row;
}

void expectSameAsStd(std::vector<Pair> row, int64_t k, const char *what) {
  std::vector<Candidate> mine(row.size());
  for (size_t i = 0; i < row.size(); ++i)
    mine[i] = {row[i].first, static_cast<int32_t>(row[i].second)};
  int64_t n = static_cast<int64_t>(row.size());
  // The CPU's selectTopK.
  if (k * 64 <= n)
    std::partial_sort(row.begin(), row.begin() + k, row.end(), stdRanksHigher);
  else {
    std::nth_element(row.begin(), row.begin() + k - 1, row.end(), stdRanksHigher);
    std::sort(row.begin(), row.begin() + k - 1, stdRanksHigher);
  }
  selectTopK(mine.data(), n, k);
  for (size_t i = 0; i < row.size(); ++i)
    ASSERT_EQ(mine[i].key, row[i].second) << what << ": n " << n << " k " << k << " slot " << i;
}

TEST(StlSelectTest, SelectTopKPermutesLikeLibstdcxx) {
  std::mt19937_64 rng(7);
  for (int64_t n : {1, 2, 3, 4, 5, 7, 16, 17, 33, 64, 100, 200, 257, 1000, 4096}) {
    for (int distinct : {0, 1, 2, 3, 8, 50}) {
      for (int64_t k : {int64_t(1), int64_t(2), int64_t(3), int64_t(5), int64_t(16), n / 3 + 1,
                        n - 1, n}) {
        if (k < 1 || k > n)
          continue;
        std::uniform_int_distribution<int64_t> lastPick(0, n - 1);
        for (int rep = 0; rep < 3; ++rep) {
          int64_t last = rep == 0 ? n - 1 : lastPick(rng);
          expectSameAsStd(makeRow(rng, n, last, distinct), k, "selectTopK");
        }
      }
    }
  }
}

TEST(StlSelectTest, SortAndNthElementAloneMatch) {
  std::mt19937_64 rng(11);
  for (int64_t n : {2, 15, 16, 17, 31, 100, 513, 3000}) {
    for (int distinct : {0, 2, 5, 40}) {
      std::vector<Pair> row = makeRow(rng, n, n - 1, distinct), other = row;
      std::vector<Candidate> mine(row.size());
      for (size_t i = 0; i < row.size(); ++i)
        mine[i] = {row[i].first, static_cast<int32_t>(row[i].second)};
      std::vector<Candidate> mine2 = mine;
      std::sort(row.begin(), row.end(), stdRanksHigher);
      sort(mine.data(), mine.data() + n);
      for (size_t i = 0; i < row.size(); ++i)
        ASSERT_EQ(mine[i].key, row[i].second) << "sort n " << n << " slot " << i;
      int64_t nth = n / 2;
      std::nth_element(other.begin(), other.begin() + nth, other.end(), stdRanksHigher);
      nthElement(mine2.data(), mine2.data() + nth, mine2.data() + n);
      for (size_t i = 0; i < other.size(); ++i)
        ASSERT_EQ(mine2[i].key, other[i].second) << "nth_element n " << n << " slot " << i;
    }
  }
}

TEST(StlSelectTest, DepthLimitFallbacksMatch) {
  // Organ-pipe and sawtooth rows push introselect / introsort towards their heap fallbacks.
  for (int64_t n : {64, 500, 2048}) {
    std::vector<Pair> pipe, saw;
    for (int64_t s = 0; s < n; ++s) {
      pipe.push_back({static_cast<float>(s < n / 2 ? s : n - s), s});
      saw.push_back({static_cast<float>(s % 7), s});
    }
    for (int64_t k : {int64_t(1), int64_t(9), n / 2, n}) {
      expectSameAsStd(pipe, k, "organ pipe");
      expectSameAsStd(saw, k, "sawtooth");
    }
  }
}

} // namespace
} // namespace moec::runtime::cuda::attention::stl
