//===- DataLoaderTest.cpp - packing, shuffling, resuming -----------------===//

#include "runtime/data/DataLoader.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "runtime/weights/TestSupport.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moec::runtime::data {
namespace {

namespace wt = weights::testing;
using ::testing::HasSubstr;

/// A token file holding 0, 1, ..., count-1 (so token = its place in the stream).
std::shared_ptr<const Dataset> countingDataset(int64_t count) {
  std::vector<int64_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), int64_t(0));
  std::string path = wt::freshTempDir() + "/count.bin";
  EXPECT_TRUE(writeTokenFile(path, tokens, 2).ok());
  auto dataset = Dataset::readTokenFile(path, 1 << 16);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  return dataset.ok() ? std::shared_ptr<const Dataset>(std::move(*dataset)) : nullptr;
}

std::unique_ptr<DataLoader> makeLoader(std::shared_ptr<const Dataset> dataset,
                                       LoaderOptions options) {
  auto loader = DataLoader::create(std::move(dataset), options);
  EXPECT_TRUE(loader.ok()) << loader.status();
  return loader.ok() ? std::move(*loader) : nullptr;
}

std::vector<int64_t> range(int64_t first, int64_t count) {
  std::vector<int64_t> out(static_cast<size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

TEST(DataLoaderTest, PacksWindowsInOrderAndDropsTheTail) {
  // 23 tokens, seq_len 5: windows 0..3, the last 3 tokens are dropped.
  auto loader = makeLoader(countingDataset(23), {/*microBatch=*/2, /*seqLen=*/5});
  ASSERT_TRUE(loader);
  EXPECT_EQ(loader->windowsPerEpoch(), 4);

  Batch batch = loader->next();
  EXPECT_EQ(batch.microBatch, 2);
  EXPECT_EQ(batch.seqLen, 5);
  EXPECT_EQ(batch.inputIds, range(0, 10));
  EXPECT_EQ(batch.labels, range(0, 10)) << "labels are aligned, not shifted";
  EXPECT_EQ(batch.positions, (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(batch.windows, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batch.numTargets, 8) << "the first label of each row is never scored";

  batch = loader->next();
  EXPECT_EQ(batch.inputIds, range(10, 10));
  EXPECT_EQ(batch.epochs, (std::vector<int64_t>{0, 0}));

  // Epochs wrap around; tokens 20..22 never appear.
  batch = loader->next();
  EXPECT_EQ(batch.inputIds, range(0, 10));
  EXPECT_EQ(batch.epochs, (std::vector<int64_t>{1, 1}));
}

TEST(DataLoaderTest, BatchesStraddleEpochs) {
  auto loader = makeLoader(countingDataset(15), {/*microBatch=*/2, /*seqLen=*/5});
  ASSERT_TRUE(loader);
  ASSERT_EQ(loader->windowsPerEpoch(), 3);
  loader->next();
  Batch batch = loader->next();
  EXPECT_EQ(batch.windows, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(batch.epochs, (std::vector<int64_t>{0, 1}));
  std::vector<int64_t> expected = range(10, 5);
  for (int64_t t : range(0, 5))
    expected.push_back(t);
  EXPECT_EQ(batch.inputIds, expected);
}

TEST(DataLoaderTest, PadsTheLastWindowWhenAsked) {
  LoaderOptions options{/*microBatch=*/1, /*seqLen=*/4};
  options.padLastWindow = true;
  options.padId = 9;
  auto loader = makeLoader(countingDataset(6), options);
  ASSERT_TRUE(loader);
  ASSERT_EQ(loader->windowsPerEpoch(), 2);
  loader->next();
  Batch batch = loader->next();
  EXPECT_EQ(batch.inputIds, (std::vector<int64_t>{4, 5, 9, 9}));
  EXPECT_EQ(batch.labels, (std::vector<int64_t>{4, 5, -100, -100}));
  EXPECT_EQ(batch.numTargets, 1);
}

TEST(DataLoaderTest, DocumentsAndLabelsConcatenateAcrossWindows) {
  std::string path = wt::freshTempDir() + "/data.jsonl";
  wt::writeFileBytes(path, "{\"input_ids\": [1, 2, 3], \"labels\": [-100, -100, 3]}\n"
                           "{\"input_ids\": [4, 5, 6, 7]}\n"
                           "{\"input_ids\": [8], \"labels\": [-100]}\n");
  auto dataset = Dataset::readJsonLines(path, 10);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto loader = makeLoader(std::move(*dataset), {/*microBatch=*/2, /*seqLen=*/4});
  ASSERT_TRUE(loader);
  Batch batch = loader->next();
  EXPECT_EQ(batch.inputIds, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(batch.labels, (std::vector<int64_t>{-100, -100, 3, 4, 5, 6, 7, -100}));
  // Row 0 scores positions 2 and 3; row 1 scores 1 and 2 (position 3 is -100).
  EXPECT_EQ(batch.numTargets, 4);
}

TEST(DataLoaderTest, RejectsBadOptions) {
  auto dataset = countingDataset(10);
  auto error = [&](LoaderOptions options) {
    auto loader = DataLoader::create(dataset, options);
    EXPECT_FALSE(loader.ok());
    return loader.ok() ? std::string() : std::string(loader.status().message());
  };
  EXPECT_THAT(error({0, 4}), HasSubstr("micro_batch must be at least 1"));
  EXPECT_THAT(error({1, 0}), HasSubstr("seq_len must be at least 1"));
  EXPECT_THAT(error({1, 11}), HasSubstr("the dataset has 10 tokens, fewer than one window"));
  LoaderOptions pad{1, 4};
  pad.padLastWindow = true;
  pad.padId = 1 << 16;
  EXPECT_THAT(error(pad), HasSubstr("the pad id 65536 is outside the vocabulary"));
}

std::vector<std::vector<int64_t>> readBatches(DataLoader &loader, int count) {
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < count; ++i)
    out.push_back(loader.next().inputIds);
  return out;
}

TEST(DataLoaderTest, ShuffleIsASeededPermutationPerEpoch) {
  auto dataset = countingDataset(64 * 4);
  LoaderOptions options{/*microBatch=*/1, /*seqLen=*/4};
  options.shuffle = true;
  options.seed = 1234;
  auto a = makeLoader(dataset, options);
  auto b = makeLoader(dataset, options);
  options.seed = 1235;
  auto c = makeLoader(dataset, options);
  ASSERT_TRUE(a && b && c);
  ASSERT_EQ(a->windowsPerEpoch(), 64);

  std::vector<int64_t> epoch0, epoch1, other;
  for (int i = 0; i < 64; ++i) {
    Batch batch = a->next();
    EXPECT_EQ(batch.inputIds[0], batch.windows[0] * 4) << "a window stays whole";
    epoch0.push_back(batch.windows[0]);
    EXPECT_EQ(b->next().windows[0], epoch0.back()) << "same seed, same order";
    other.push_back(c->next().windows[0]);
  }
  for (int i = 0; i < 64; ++i)
    epoch1.push_back(a->next().windows[0]);

  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, range(0, 64)) << "every window once per epoch";
  sorted = epoch1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, range(0, 64));
  EXPECT_NE(epoch0, range(0, 64)) << "shuffled";
  EXPECT_NE(epoch0, epoch1) << "a new order each epoch";
  EXPECT_NE(epoch0, other) << "another seed, another order";
  EXPECT_EQ(shuffledOrder(64, 1234, 0), epoch0);
  EXPECT_EQ(shuffledOrder(64, 1234, 1), epoch1);
}

TEST(DataLoaderTest, ShuffledOrderIsPinned) {
  // The order is part of the resume contract across builds and machines:
  // this pins SplitMix64 + Fisher-Yates as README.md describes them.
  std::vector<int64_t> order = shuffledOrder(8, 42, 3);
  std::vector<int64_t> again = shuffledOrder(8, 42, 3);
  EXPECT_EQ(order, again);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, range(0, 8));
  EXPECT_EQ(shuffledOrder(1, 42, 3), (std::vector<int64_t>{0}));
  EXPECT_TRUE(shuffledOrder(0, 42, 3).empty());
}

TEST(DataLoaderTest, RestoreResumesWithTheSameBatches) {
  auto dataset = countingDataset(50 * 3);
  for (bool shuffle : {false, true}) {
    LoaderOptions options{/*microBatch=*/3, /*seqLen=*/3};
    options.shuffle = shuffle;
    options.seed = 7;
    auto first = makeLoader(dataset, options);
    ASSERT_TRUE(first);
    readBatches(*first, 20); // 60 windows: into the second epoch
    LoaderState saved = first->state();
    EXPECT_EQ(saved.epoch, 1);
    EXPECT_EQ(saved.position, 10);
    std::vector<std::vector<int64_t>> expected = readBatches(*first, 40);

    // A fresh loader (as in a resumed process), restored from the text form.
    auto resumed = makeLoader(dataset, options);
    ASSERT_TRUE(resumed);
    auto parsed = LoaderState::parse(saved.toString());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, saved);
    ASSERT_TRUE(resumed->restore(*parsed).ok());
    EXPECT_EQ(resumed->state(), saved);
    EXPECT_EQ(readBatches(*resumed, 40), expected) << "shuffle=" << shuffle;
    EXPECT_EQ(resumed->state(), first->state());
  }
}

TEST(DataLoaderTest, RestoreRejectsAnotherLoadersState) {
  auto dataset = countingDataset(40);
  LoaderOptions options{/*microBatch=*/1, /*seqLen=*/4};
  options.shuffle = true;
  options.seed = 1;
  auto loader = makeLoader(dataset, options);
  ASSERT_TRUE(loader);
  LoaderState state = loader->state();

  LoaderState other = state;
  other.seed = 2;
  EXPECT_THAT(std::string(loader->restore(other).message()),
              HasSubstr("the state has seed 2, this loader has 1"));
  other = state;
  other.seqLen = 8;
  EXPECT_THAT(std::string(loader->restore(other).message()), HasSubstr("seq_len 8"));
  other = state;
  other.numTokens = 41;
  EXPECT_FALSE(loader->restore(other).ok());
  other = state;
  other.position = 10;
  EXPECT_THAT(std::string(loader->restore(other).message()), HasSubstr("outside [0, 10)"));
}

TEST(LoaderStateTest, ParseRejectsGarbage) {
  EXPECT_FALSE(LoaderState::parse("").ok());
  EXPECT_FALSE(LoaderState::parse("moe-data-state v2 epoch=0").ok());
  LoaderState state;
  std::string text = state.toString();
  EXPECT_TRUE(LoaderState::parse(text).ok()) << text;
  EXPECT_THAT(std::string(LoaderState::parse(text + " extra=1").status().message()),
              HasSubstr("unknown key \"extra\""));
  std::string broken = text;
  broken.replace(broken.find("epoch=0"), 7, "epoch=x");
  EXPECT_THAT(std::string(LoaderState::parse(broken).status().message()),
              HasSubstr("\"epoch\" is \"x\", expected an integer"));
}

} // namespace
} // namespace moec::runtime::data
