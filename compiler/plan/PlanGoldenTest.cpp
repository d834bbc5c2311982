//===- PlanGoldenTest.cpp - plans of the golden models vs. their files ----===//
//
// Compiles every golden tiny model with its PEFT adapter's adapter_config.json for the
// golden batch (2 x 96 tokens) and checks the emitted plan against the files
// Hugging Face wrote: the LoRA tensors equal adapter_model.safetensors (names
// and shapes), the weight bindings, expanded per expert, equal
// model.safetensors, and the plan passes the runtime's validator.
//
//===----------------------------------------------------------------------===//

#include <map>
#include <string>
#include <vector>

#include "compiler/frontend/ImportModel.h"
#include "compiler/pipelines/Pipelines.h"
#include "compiler/plan/EmitPlan.h"
#include "runtime/plan/PlanValidator.h"
#include "runtime/weights/Safetensors.h"
#include "runtime/weights/TestSupport.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "gtest/gtest.h"

namespace moec::compiler {
namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

Shapes tensorsOf(const std::string &path) {
  auto file = runtime::weights::SafetensorsFile::open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  Shapes shapes;
  if (file.ok())
    for (const runtime::weights::TensorInfo &tensor : (*file)->tensors())
      shapes[tensor.name] = tensor.shape;
  return shapes;
}

class PlanGoldenTest : public ::testing::TestWithParam<const char *> {};

TEST_P(PlanGoldenTest, TrainableTensorsAndBindingsMatchTheFiles) {
  std::string dir = runtime::weights::testing::goldenDir() + "/" + GetParam();
  mlir::MLIRContext context;
  auto module = frontend::importConfigFile(dir + "/config.json", context, nullptr);
  ASSERT_TRUE(static_cast<bool>(module)) << llvm::toString(module.takeError());
  pipelines::LoRATrainingOptions options;
  options.adapterConfig = dir + "/adapter"; // what `moec compile --adapter DIR` passes
  options.seqLen = 96;
  options.microBatch = 2;
  mlir::PassManager pm(&context);
  pipelines::buildLoRATrainingPipeline(pm, options);
  ASSERT_TRUE(succeeded(pm.run(**module)));
  auto model = *(**module).getOps<moe::ModelOp>().begin();
  mlir::FailureOr<Program> program = buildProgram(model, 96, 2);
  ASSERT_TRUE(succeeded(program));
  assignOffsets(*program);
  mlir::FailureOr<plan::Plan> plan = emitPlan(model, {*program});
  ASSERT_TRUE(succeeded(plan));
  absl::Status valid = plan::validatePlan(*plan);
  ASSERT_TRUE(valid.ok()) << valid;

  const plan::Rank &rank = plan->ranks(0);
  auto shapeOf = [&](uint32_t id) {
    const auto &shape = rank.buffers(id).shape();
    return std::vector<int64_t>(shape.begin(), shape.end());
  };
  Shapes lora;
  for (const plan::LoraTensor &tensor : plan->lora().tensors())
    lora[tensor.peft_name()] = shapeOf(tensor.param());
  EXPECT_EQ(lora, tensorsOf(dir + "/adapter/adapter_model.safetensors"));
  EXPECT_EQ(plan->lora().r(), 4); // the golden adapters' r (shared/golden/README.md)
  EXPECT_EQ(plan->lora().alpha(), 8);

  Shapes weights;
  for (const plan::WeightBinding &binding : rank.weights()) {
    std::vector<int64_t> shape = shapeOf(binding.buffer());
    std::string name = binding.tensor();
    size_t at = name.find("{expert}");
    if (at == std::string::npos) {
      weights[name] = shape;
      continue;
    }
    for (int64_t e = 0; e < shape[0]; ++e)
      weights[std::string(name).replace(at, 8, std::to_string(binding.first_expert() + e))] =
          std::vector<int64_t>(shape.begin() + 1, shape.end());
  }
  EXPECT_EQ(weights, tensorsOf(dir + "/model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Golden, PlanGoldenTest,
                         ::testing::Values("deepseek_v3", "deepseek_v32", "kimi_linear", "mixtral",
                                           "nemotron_h", "qwen3_moe", "qwen3_next"));

} // namespace
} // namespace moec::compiler
