//===- DataLoader.cpp - packed batches of a dataset ----------------------===//

#include "runtime/data/DataLoader.h"

#include <charconv>
#include <map>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moec::runtime::data {
namespace {

/// SplitMix64 (Steele, Lea and Flood 2014; the generator Java's
/// SplittableRandom and xoshiro's seeding use).
uint64_t splitMix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Uniform in [0, n) without modulo bias: draws below 2^64 mod n are rejected.
uint64_t uniformBelow(uint64_t &state, uint64_t n) {
  uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t x = splitMix64(state);
    if (x >= threshold)
      return x % n;
  }
}

} // namespace

std::vector<int64_t> shuffledOrder(int64_t numWindows, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(numWindows));
  std::iota(order.begin(), order.end(), int64_t(0));
  uint64_t mixed = seed;
  uint64_t state = splitMix64(mixed) ^ uint64_t(epoch);
  for (int64_t i = numWindows - 1; i > 0; --i) {
    int64_t j = int64_t(uniformBelow(state, uint64_t(i) + 1));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

bool LoaderState::operator==(const LoaderState &other) const {
  return epoch == other.epoch && position == other.position && numTokens == other.numTokens &&
         seqLen == other.seqLen && windowsPerEpoch == other.windowsPerEpoch &&
         shuffle == other.shuffle && seed == other.seed;
}

std::string LoaderState::toString() const {
  return absl::StrCat("moe-data-state v1 epoch=", epoch, " position=", position,
                      " tokens=", numTokens, " seq_len=", seqLen, " windows=", windowsPerEpoch,
                      " shuffle=", shuffle ? 1 : 0, " seed=", seed);
}

absl::StatusOr<LoaderState> LoaderState::parse(const std::string &text) {
  auto error = [&](const std::string &what) {
    return absl::InvalidArgumentError(
        absl::StrCat("data loader state \"", text, "\": ", what));
  };
  std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (words.size() < 2 || words[0] != "moe-data-state" || words[1] != "v1")
    return error("expected it to start with \"moe-data-state v1\"");
  std::map<std::string, std::string> fields;
  for (size_t i = 2; i < words.size(); ++i) {
    size_t equals = words[i].find('=');
    if (equals == std::string::npos)
      return error(absl::StrCat("expected key=value, found \"", words[i], "\""));
    if (!fields.emplace(words[i].substr(0, equals), words[i].substr(equals + 1)).second)
      return error(absl::StrCat("\"", words[i].substr(0, equals), "\" appears twice"));
  }
  LoaderState state;
  auto number = [&](const std::string &key, auto &out) -> absl::Status {
    auto found = fields.find(key);
    if (found == fields.end())
      return error(absl::StrCat("missing \"", key, "\""));
    const std::string &value = found->second;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
    if (ec != std::errc() || end != value.data() + value.size())
      return error(absl::StrCat("\"", key, "\" is \"", value, "\", expected an integer"));
    fields.erase(found);
    return absl::OkStatus();
  };
  int64_t shuffle = 0;
  for (auto status : {number("epoch", state.epoch), number("position", state.position),
                      number("tokens", state.numTokens), number("seq_len", state.seqLen),
                      number("windows", state.windowsPerEpoch), number("shuffle", shuffle),
                      number("seed", state.seed)})
    if (!status.ok())
      return status;
  if (shuffle != 0 && shuffle != 1)
    return error("\"shuffle\" must be 0 or 1");
  state.shuffle = shuffle == 1;
  if (!fields.empty())
    return error(absl::StrCat("unknown key \"", fields.begin()->first, "\""));
  return state;
}

absl::StatusOr<std::unique_ptr<DataLoader>>
DataLoader::create(std::shared_ptr<const Dataset> dataset, const LoaderOptions &options) {
  if (!dataset)
    return absl::InvalidArgumentError("data loader: no dataset");
  auto error = [&](const std::string &what) {
    return absl::InvalidArgumentError(absl::StrCat(dataset->path(), ": ", what));
  };
  if (options.microBatch < 1)
    return error(absl::StrCat("micro_batch must be at least 1, got ", options.microBatch));
  if (options.seqLen < 1)
    return error(absl::StrCat("seq_len must be at least 1, got ", options.seqLen));
  if (options.padLastWindow && (options.padId < 0 || options.padId >= dataset->vocabSize()))
    return error(absl::StrCat("the pad id ", options.padId, " is outside the vocabulary [0, ",
                              dataset->vocabSize(), ")"));
  int64_t tokens = dataset->numTokens();
  int64_t windows = options.padLastWindow ? (tokens + options.seqLen - 1) / options.seqLen
                                          : tokens / options.seqLen;
  if (windows == 0)
    return error(absl::StrCat("the dataset has ", tokens, " tokens, fewer than one window of seq_len ",
                              options.seqLen, " (pad the last window or use a shorter seq_len)"));
  std::unique_ptr<DataLoader> loader(new DataLoader());
  loader->dataset = std::move(dataset);
  loader->opts = options;
  loader->numWindows = windows;
  return loader;
}

void DataLoader::loadOrder(int64_t wanted) {
  if (orderEpoch == wanted)
    return;
  order = shuffledOrder(numWindows, opts.seed, wanted);
  orderEpoch = wanted;
}

int64_t DataLoader::windowAt(int64_t atEpoch, int64_t index) {
  if (!opts.shuffle)
    return index;
  loadOrder(atEpoch);
  return order[size_t(index)];
}

Batch DataLoader::next() {
  Batch batch;
  next(batch);
  return batch;
}

void DataLoader::next(Batch &batch) {
  const int64_t rows = opts.microBatch, seq = opts.seqLen;
  batch.microBatch = rows;
  batch.seqLen = seq;
  batch.inputIds.resize(size_t(rows * seq));
  batch.labels.resize(size_t(rows * seq));
  batch.positions.resize(size_t(rows * seq));
  batch.windows.resize(size_t(rows));
  batch.epochs.resize(size_t(rows));
  batch.numTargets = 0;
  const int64_t tokens = dataset->numTokens();
  for (int64_t row = 0; row < rows; ++row) {
    int64_t window = windowAt(epoch, position);
    batch.windows[size_t(row)] = window;
    batch.epochs[size_t(row)] = epoch;
    int64_t *ids = batch.inputIds.data() + row * seq;
    int64_t *labels = batch.labels.data() + row * seq;
    int64_t start = window * seq;
    int64_t available = std::min(seq, tokens - start);
    dataset->copy(start, available, ids, labels);
    for (int64_t s = available; s < seq; ++s) {
      ids[s] = opts.padId;
      labels[s] = kIgnoreIndex;
    }
    for (int64_t s = 0; s < seq; ++s) {
      batch.positions[size_t(row * seq + s)] = s;
      if (s >= 1 && labels[s] != kIgnoreIndex)
        ++batch.numTargets;
    }
    if (++position == numWindows) {
      ++epoch;
      position = 0;
    }
  }
}

LoaderState DataLoader::state() const {
  LoaderState state;
  state.epoch = epoch;
  state.position = position;
  state.numTokens = dataset->numTokens();
  state.seqLen = opts.seqLen;
  state.windowsPerEpoch = numWindows;
  state.shuffle = opts.shuffle;
  state.seed = opts.shuffle ? opts.seed : 0;
  return state;
}

absl::Status DataLoader::restore(const LoaderState &state) {
  LoaderState mine = this->state();
  auto mismatch = [&](const std::string &what, auto saved, auto here) {
    return absl::FailedPreconditionError(
        absl::StrCat(dataset->path(), ": cannot restore the data position: the state has ", what,
                     " ", saved, ", this loader has ", here));
  };
  if (state.numTokens != mine.numTokens)
    return mismatch("a dataset of tokens", state.numTokens, mine.numTokens);
  if (state.seqLen != mine.seqLen)
    return mismatch("seq_len", state.seqLen, mine.seqLen);
  if (state.windowsPerEpoch != mine.windowsPerEpoch)
    return mismatch("windows per epoch", state.windowsPerEpoch, mine.windowsPerEpoch);
  if (state.shuffle != mine.shuffle)
    return mismatch("shuffle", state.shuffle ? "on" : "off", mine.shuffle ? "on" : "off");
  if (state.seed != mine.seed)
    return mismatch("seed", state.seed, mine.seed);
  if (state.epoch < 0 || state.position < 0 || state.position >= numWindows)
    return absl::InvalidArgumentError(absl::StrCat(
        dataset->path(), ": cannot restore the data position: epoch ", state.epoch,
        ", position ", state.position, " is outside [0, ", numWindows, ") windows"));
  epoch = state.epoch;
  position = state.position;
  return absl::OkStatus();
}

} // namespace moec::runtime::data
