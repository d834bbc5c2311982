//===- ImportGoldenTest.cpp - imported IR vs. the golden checkpoints -------===//
//
// For each golden tiny model, imports its config.json and checks that the
// parameters the IR declares, expanded per layer and per expert, are exactly
// the tensors of its model.safetensors (names and shapes), and that the model
// summary counts as many parameters as the file holds.
//
//===----------------------------------------------------------------------===//

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/analysis/ModelSummary.h"
#include "compiler/frontend/ImportModel.h"
#include "dialects/moe/MoeOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Endian.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include "gtest/gtest.h"

using namespace llvm;

namespace moec::frontend {
namespace {

/// Parameter name -> shape.
using TensorShapes = std::map<std::string, std::vector<int64_t>>;

std::string shapeString(ArrayRef<int64_t> shape) {
  std::string out = "[";
  for (auto [i, dim] : llvm::enumerate(shape))
    out += (i ? ", " : "") + std::to_string(dim);
  return out + "]";
}

int64_t numElements(ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t dim : shape)
    n *= dim;
  return n;
}

/// The golden folder of `family` in the test's runfiles, or an error saying where it looked.
Expected<std::string> goldenDir(StringRef family) {
  const char *srcdir = std::getenv("TEST_SRCDIR");
  if (!srcdir)
    return createStringError(inconvertibleErrorCode(),
                             "TEST_SRCDIR is not set; run this test with `bazel test`");
  std::vector<std::string> candidates = {std::string(srcdir) + "/golden",
                                         std::string(srcdir) + "/moec/external/golden"};
  for (const std::string &root : candidates)
    if (sys::fs::is_directory(root))
      return root + "/" + family.str();
  return createStringError(inconvertibleErrorCode(),
                           "the golden references (@golden//:files) are not in the runfiles: "
                           "neither %s nor %s exists",
                           candidates[0].c_str(), candidates[1].c_str());
}

/// Reads the tensor names and shapes from a safetensors header: an 8-byte
/// little-endian length, then that many bytes of JSON.
Expected<TensorShapes> readSafetensorsHeader(StringRef path) {
  auto prefix = MemoryBuffer::getFileSlice(path, /*MapSize=*/8, /*Offset=*/0);
  if (!prefix)
    return createStringError(prefix.getError(), "%s: cannot read: %s", path.str().c_str(),
                             prefix.getError().message().c_str());
  if ((*prefix)->getBufferSize() != 8)
    return createStringError(inconvertibleErrorCode(), "%s: shorter than 8 bytes",
                             path.str().c_str());
  uint64_t length =
      support::endian::read64le(reinterpret_cast<const uint8_t *>((*prefix)->getBufferStart()));
  auto header = MemoryBuffer::getFileSlice(path, length, /*Offset=*/8);
  if (!header)
    return createStringError(header.getError(), "%s: cannot read the %llu-byte header: %s",
                             path.str().c_str(), static_cast<unsigned long long>(length),
                             header.getError().message().c_str());
  Expected<json::Value> value = json::parse((*header)->getBuffer());
  if (!value)
    return createStringError(inconvertibleErrorCode(), "%s: malformed header: %s",
                             path.str().c_str(), toString(value.takeError()).c_str());
  const json::Object *object = value->getAsObject();
  if (!object)
    return createStringError(inconvertibleErrorCode(), "%s: header is not a JSON object",
                             path.str().c_str());
  TensorShapes tensors;
  for (const auto &[key, entry] : *object) {
    if (key == "__metadata__")
      continue;
    const json::Object *info = entry.getAsObject();
    const json::Array *shape = info ? info->getArray("shape") : nullptr;
    if (!shape)
      return createStringError(inconvertibleErrorCode(), "%s: tensor '%s' has no shape",
                               path.str().c_str(), key.str().c_str());
    std::vector<int64_t> dims;
    for (const json::Value &dim : *shape) {
      std::optional<int64_t> d = dim.getAsInteger();
      if (!d)
        return createStringError(inconvertibleErrorCode(), "%s: tensor '%s' has a bad shape",
                                 path.str().c_str(), key.str().c_str());
      dims.push_back(*d);
    }
    tensors[key.str()] = std::move(dims);
  }
  return tensors;
}

std::string replaceAll(std::string text, StringRef from, StringRef to) {
  for (size_t at = 0; (at = text.find(from.str(), at)) != std::string::npos; at += to.size())
    text.replace(at, from.size(), to.str());
  return text;
}

/// The checkpoint tensors the IR binds: model-level params as they are, each
/// template's params once per `moe.apply_layer` of it with `{layer}` replaced
/// by its index, and `{expert}` params split into one tensor per expert.
/// Names bound twice go to `duplicates`.
TensorShapes declaredTensors(moe::ModelOp model, std::vector<std::string> &duplicates) {
  TensorShapes out;
  auto add = [&](const std::string &name, std::vector<int64_t> shape) {
    if (!out.emplace(name, std::move(shape)).second)
      duplicates.push_back(name);
  };
  auto addParam = [&](moe::ParamOp param, std::optional<int64_t> layer) {
    std::string name = param.getTensorName().str();
    if (layer)
      name = replaceAll(name, "{layer}", std::to_string(*layer));
    ArrayRef<int64_t> shape = param.getTensorType().getShape();
    if (!param.isPerExpert()) {
      add(name, shape.vec());
      return;
    }
    // A per-expert tensor with no leading dimension is reported as its unexpanded name.
    if (shape.empty()) {
      add(name, {});
      return;
    }
    for (int64_t e = 0; e < shape.front(); ++e)
      add(replaceAll(name, "{expert}", std::to_string(e)), shape.drop_front().vec());
  };

  std::map<std::string, moe::LayerOp> templates;
  for (mlir::Operation &op : model.getBody().front()) {
    if (auto param = dyn_cast<moe::ParamOp>(op))
      addParam(param, std::nullopt);
    else if (auto layer = dyn_cast<moe::LayerOp>(op))
      templates[layer.getSymName().str()] = layer;
  }
  model.walk([&](moe::ApplyLayerOp apply) {
    auto it = templates.find(apply.getCallee().str());
    if (it == templates.end()) {
      duplicates.push_back("<apply_layer of unknown template @" + apply.getCallee().str() + ">");
      return;
    }
    for (moe::ParamOp param : it->second.getBody().getOps<moe::ParamOp>())
      addParam(param, static_cast<int64_t>(apply.getIndex()));
  });
  return out;
}

class ImportGoldenTest : public ::testing::TestWithParam<std::string> {};

// Tests that the imported IR declares exactly the checkpoint's tensors and
// that the summary's total is the checkpoint's element count.
TEST_P(ImportGoldenTest, ParamsMatchCheckpoint) {
  const std::string &family = GetParam();
  Expected<std::string> dir = goldenDir(family);
  ASSERT_TRUE(static_cast<bool>(dir)) << toString(dir.takeError());
  std::string configPath = *dir + "/config.json";
  std::string checkpointPath = *dir + "/model.safetensors";

  mlir::MLIRContext context;
  auto module = importConfigFile(configPath, context);
  ASSERT_TRUE(static_cast<bool>(module))
      << "import of " << configPath << " failed: " << toString(module.takeError());
  auto models = (*module)->getOps<moe::ModelOp>();
  ASSERT_EQ(std::distance(models.begin(), models.end()), 1)
      << "expected one moe.model in the imported module";
  moe::ModelOp model = *models.begin();

  Expected<TensorShapes> file = readSafetensorsHeader(checkpointPath);
  ASSERT_TRUE(static_cast<bool>(file)) << toString(file.takeError());
  ASSERT_FALSE(file->empty()) << checkpointPath << " holds no tensors";

  std::vector<std::string> duplicates;
  TensorShapes declared = declaredTensors(model, duplicates);

  std::vector<std::string> missing, extra, mismatched;
  for (const auto &[name, shape] : *file) {
    auto it = declared.find(name);
    if (it == declared.end())
      missing.push_back(name + " " + shapeString(shape));
    else if (it->second != shape)
      mismatched.push_back(name + ": IR " + shapeString(it->second) + ", file " +
                           shapeString(shape));
  }
  for (const auto &[name, shape] : declared)
    if (!file->count(name))
      extra.push_back(name + " " + shapeString(shape));

  std::string report;
  raw_string_ostream os(report);
  auto list = [&](StringRef title, ArrayRef<std::string> items) {
    if (items.empty())
      return;
    os << title << " (" << items.size() << "):\n";
    for (const std::string &item : items)
      os << "  " << item << "\n";
  };
  list("in " + checkpointPath + " but not declared by the IR (missing)", missing);
  list("declared by the IR but not in the checkpoint (extra)", extra);
  list("declared with a different shape", mismatched);
  list("declared more than once", duplicates);
  EXPECT_TRUE(missing.empty() && extra.empty() && mismatched.empty() && duplicates.empty())
      << family << ": the IR's parameters differ from the checkpoint's tensors\n"
      << os.str();

  int64_t fileElements = 0;
  for (const auto &[name, shape] : *file)
    fileElements += numElements(shape);
  analysis::ModelSummary summary = analysis::summarizeModel(model);
  EXPECT_EQ(summary.totalParams, fileElements)
      << family << ": summary total vs. elements in " << checkpointPath;
}

INSTANTIATE_TEST_SUITE_P(Golden, ImportGoldenTest,
                         ::testing::Values("deepseek_v3", "deepseek_v32", "kimi_linear", "mixtral",
                                           "nemotron_h", "qwen3_moe", "qwen3_next"),
                         [](const ::testing::TestParamInfo<std::string> &info) {
                           return info.param;
                         });

} // namespace
} // namespace moec::frontend
