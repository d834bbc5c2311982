//===- DataLoader.h - packed batches of a dataset ---------------*- C++ -*-===//
//
// Packs a Dataset into batches of micro_batch x seq_len tokens. The stream
// (documents concatenated in order, labels aligned with their tokens) is cut
// into windows: window w holds tokens [w * seq_len, (w + 1) * seq_len). A
// tail shorter than seq_len is dropped, or, with `padLastWindow`, padded with
// `padId` tokens labelled -100.
//
// An epoch visits every window once: in order, or, with `shuffle`, in a
// permutation drawn from (seed, epoch). A batch takes the next micro_batch
// windows of that endless sequence of epochs, so a batch may straddle two
// epochs and no window is ever skipped. Labels are aligned with input_ids,
// not shifted: the loss shifts them (Hugging Face style), so the first label
// of each sequence is never scored.
//
// state() is the read position; restore() of it makes the next batch the
// same as it was when state() was taken, in this process or another.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_DATA_DATALOADER_H_
#define RUNTIME_DATA_DATALOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/data/Dataset.h"

namespace moec::runtime::data {

struct LoaderOptions {
  int64_t microBatch = 1;
  int64_t seqLen = 0;
  bool shuffle = false;
  uint64_t seed = 0;
  bool padLastWindow = false;
  int64_t padId = 0;
};

/// One batch; every vector has microBatch * seqLen entries, row-major [B, S].
struct Batch {
  int64_t microBatch = 0;
  int64_t seqLen = 0;
  std::vector<int64_t> inputIds;
  std::vector<int64_t> labels;
  /// 0 .. seqLen-1 in every sequence.
  std::vector<int64_t> positions;
  /// The windows the rows came from, and the epoch of each row.
  std::vector<int64_t> windows;
  std::vector<int64_t> epochs;
  /// Labels the shifted loss scores: labels[b][s] != -100 for s >= 1.
  int64_t numTargets = 0;
};

/// The read position, and what it is only meaningful for.
struct LoaderState {
  /// The epoch of the next window, and how many windows of it were read.
  int64_t epoch = 0;
  int64_t position = 0;
  // The loader the state belongs to; restore() insists that they match.
  int64_t numTokens = 0;
  int64_t seqLen = 0;
  int64_t windowsPerEpoch = 0;
  bool shuffle = false;
  uint64_t seed = 0;

  bool operator==(const LoaderState &other) const;
  bool operator!=(const LoaderState &other) const { return !(*this == other); }
  /// One line, "moe-data-state v1 epoch=.. position=.. tokens=.. seq_len=.. windows=..
  /// shuffle=0|1 seed=..", for checkpoints.
  std::string toString() const;
  static absl::StatusOr<LoaderState> parse(const std::string &text);
};

class DataLoader {
public:
  /// Fails when the options are out of range or the dataset has no whole
  /// window (fewer than seqLen tokens, without padLastWindow).
  static absl::StatusOr<std::unique_ptr<DataLoader>>
  create(std::shared_ptr<const Dataset> dataset, const LoaderOptions &options);

  /// The next batch; never fails.
  Batch next();
  void next(Batch &batch);

  LoaderState state() const;
  /// Moves to `state`, which must come from a loader with the same dataset
  /// size, seq_len, windows, shuffle and seed; the micro batch may differ.
  absl::Status restore(const LoaderState &state);

  int64_t windowsPerEpoch() const { return numWindows; }
  const LoaderOptions &options() const { return opts; }

  /// The window at `index` of `epoch`'s visiting order.
  int64_t windowAt(int64_t epoch, int64_t index);

private:
  DataLoader() = default;
  void loadOrder(int64_t epoch);

  std::shared_ptr<const Dataset> dataset;
  LoaderOptions opts;
  int64_t numWindows = 0;
  int64_t epoch = 0;
  int64_t position = 0;
  /// The visiting order of `orderEpoch` (shuffle only).
  int64_t orderEpoch = -1;
  std::vector<int64_t> order;
};

/// The visiting order of `numWindows` windows in `epoch` under `seed`: a
/// Fisher-Yates shuffle driven by SplitMix64 (see README.md).
std::vector<int64_t> shuffledOrder(int64_t numWindows, uint64_t seed, int64_t epoch);

} // namespace moec::runtime::data

#endif // RUNTIME_DATA_DATALOADER_H_
