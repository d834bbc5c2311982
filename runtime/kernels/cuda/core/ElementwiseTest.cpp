//===- ElementwiseTest.cpp - elementwise core kernels on CUDA against the CPU -===//

#include <cuda_runtime.h>

#include <cstring>

#include "runtime/kernels/cuda/core/CoreCompare.h"

namespace moec::runtime::cuda::core::testing {
namespace {

const std::vector<std::string> kKinds = {"silu", "gelu_tanh", "relu2", "sigmoid"};

/// Random values in [-3, 3) plus the edges: 0, large of both signs.
OwnedTensor activationInput(std::vector<int64_t> shape, uint64_t seed) {
  std::vector<float> x = randomTensor(shape, seed, 3.0f).floats();
  x[0] = 0.0f;
  x[1] = -30.0f;
  x[2] = 30.0f;
  return floatTensor(shape, x);
}

const std::vector<std::vector<int64_t>> kShapes = {{3, 7}, {100, 33}, {13, 1000}};

TEST(CudaAdd, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::vector<int64_t> &shape :
       std::vector<std::vector<int64_t>>{{3, 5}, {2, 2, 3}, {}, {1000, 33}})
    expectMatchesCpu(
        [&] {
          KernelCall call(registry(), "add");
          call.input(randomTensor(shape, 1)).input(randomTensor(shape, 2)).output(plan::F32, shape);
          return call;
        },
        "add " + shapeText(shape));
}

// The eight-at-a-time path (sizes that are multiples of 8) with each mix of element types: a
// bf16 residual plus an f32 adapter update, and the other way round.
TEST(CudaAdd, MixedTypesMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (size_t f32Input : {0, 1})
    for (const std::vector<int64_t> &shape : std::vector<std::vector<int64_t>>{{64, 40}, {7, 9}}) {
      CudaCompareOptions options;
      options.f32Inputs = {f32Input};
      expectMatchesCpuIn(
          plan::BF16,
          [&] {
            KernelCall call(registry(), "add");
            call.input(randomTensor(shape, 3)).input(randomTensor(shape, 4)).output(plan::F32, shape);
            return call;
          },
          "add, input " + std::to_string(f32Input) + " f32, " + shapeText(shape), options);
    }
}

TEST(CudaActivation, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string &kind : kKinds)
    for (const std::vector<int64_t> &shape : kShapes)
      expectMatchesCpu(
          [&] {
            KernelCall call(registry(), "activation");
            call.input(activationInput(shape, 3)).attr("kind", kind).output(plan::F32, shape);
            return call;
          },
          kind + " " + shapeText(shape));
}

TEST(CudaActivation, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string &kind : kKinds)
    for (const std::vector<int64_t> &shape : kShapes)
      expectMatchesCpu(
          [&] {
            KernelCall forward(registry(), "activation");
            forward.input(activationInput(shape, 5)).attr("kind", kind).output(plan::F32, shape);
            return backwardOf(forward, {0}, {{0, randomTensor(shape, 6)}});
          },
          kind + " backward " + shapeText(shape));
}

KernelCall gluCall(const std::string &kind, const std::vector<int64_t> &shape) {
  KernelCall call(registry(), "glu");
  call.input(activationInput(shape, 7))
      .input(randomTensor(shape, 8, 2.0f))
      .attr("kind", kind)
      .output(plan::F32, shape);
  return call;
}

TEST(CudaGlu, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string &kind : kKinds)
    for (const std::vector<int64_t> &shape : kShapes)
      expectMatchesCpu([&] { return gluCall(kind, shape); }, "glu " + kind + " " + shapeText(shape));
}

TEST(CudaGlu, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const std::string &kind : kKinds)
    for (const std::vector<int64_t> &shape : kShapes)
      for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{{0, 1}, {1}, {0}})
        expectMatchesCpu(
            [&] {
              KernelCall forward = gluCall(kind, shape);
              return backwardOf(forward, wrt, {{0, randomTensor(shape, 9)}});
            },
            "glu " + kind + " backward " + shapeText(shape) + " wrt " + shapeText(wrt));
}

KernelCall gateCall(const std::vector<int64_t> &xShape, const std::vector<int64_t> &gateShape) {
  KernelCall call(registry(), "sigmoid_gate");
  call.input(randomTensor(xShape, 12))
      .input(randomTensor(gateShape, 13, 3.0f))
      .output(plan::F32, xShape);
  return call;
}

struct GateCase {
  std::vector<int64_t> x, gate;
};

const std::vector<GateCase> kGateCases = {
    {{4, 6}, {4, 6}},       // Qwen3-Next's attention output gate
    {{4, 6}, {4, 1}},       // its shared-expert gate: one per token
    {{2, 3, 5}, {2, 3, 5}}, // rank 3
    {{100, 37}, {100, 37}}, //
    {{100, 300}, {100, 1}}, // rows wider than a warp
    {{13, 33}, {13, 1}},    //
    {{33, 1}, {33, 1}},     // a [T, 1] input: the same-shape path
    {{9, 2}, {9, 1}},       // narrower than a warp
};

TEST(CudaSigmoidGate, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const GateCase &c : kGateCases)
    expectMatchesCpu([&] { return gateCall(c.x, c.gate); },
                     "sigmoid_gate " + shapeText(c.x) + " gate " + shapeText(c.gate));
}

TEST(CudaSigmoidGate, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const GateCase &c : kGateCases)
    for (const std::vector<int64_t> &wrt : std::vector<std::vector<int64_t>>{{0, 1}, {1}, {0}})
      expectMatchesCpu(
          [&] {
            KernelCall forward = gateCall(c.x, c.gate);
            return backwardOf(forward, wrt, {{0, randomTensor(c.x, 14)}});
          },
          "sigmoid_gate backward " + shapeText(c.x) + " gate " + shapeText(c.gate) + " wrt " +
              shapeText(wrt));
}

// An f32 gate (a router's output) on a bf16 activation.
TEST(CudaSigmoidGate, F32GateOnBf16Input) {
  SKIP_WITHOUT_GPU();
  CudaCompareOptions options;
  options.f32Inputs = {1};
  expectMatchesCpuIn(
      plan::BF16, [] { return gateCall({100, 300}, {100, 1}); }, "sigmoid_gate f32 gate", options);
  options.f32Outputs = {1};
  expectMatchesCpuIn(
      plan::BF16,
      [] {
        KernelCall forward = gateCall({100, 300}, {100, 1});
        return backwardOf(forward, {0, 1}, {{0, randomTensor({100, 300}, 15)}});
      },
      "sigmoid_gate backward f32 gate", options);
}

KernelCall splitCall(int64_t rows, const std::vector<int64_t> &sizes, int64_t groups) {
  int64_t total = 0;
  for (int64_t s : sizes)
    total += s;
  KernelCall call(registry(), "split");
  call.input(randomTensor({rows, groups * total}, 15)).attr("sizes", sizes);
  if (groups != 1) // absent means 1
    call.attr("groups", groups);
  for (int64_t s : sizes)
    call.output(plan::F32, {rows, groups * s});
  return call;
}

struct SplitCase {
  int64_t rows;
  std::vector<int64_t> sizes;
  int64_t groups;
};

const std::vector<SplitCase> kSplitCases = {
    {3, {5, 3}, 1},     // kv_a_proj_with_mqa into latent and rope key
    {3, {4, 4}, 3},     // Qwen3-Next's q_proj per head into query and gate
    {3, {2, 1, 3}, 2},  // uneven parts within groups
    {100, {512, 64}, 1},
    {33, {128, 128}, 16},
    {13, {7, 1, 33}, 5},
};

std::string name(const SplitCase &c) {
  return "split rows " + std::to_string(c.rows) + " sizes " + shapeText(c.sizes) + " groups " +
         std::to_string(c.groups);
}

TEST(CudaMicrobatch, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  // A pipeline step's micro-batch of rows (hidden states, token ids) and a scalar loss weight.
  struct Case {
    std::vector<int64_t> in, out;
    int64_t index, count;
  };
  for (const Case &c : std::vector<Case>{{{96, 64}, {24, 64}, 3, 4}, {{1000, 33}, {500, 33}, 0, 2}, {{4}, {}, 2, 4}})
    expectMatchesCpu(
        [&] {
          KernelCall call(registry(), "microbatch");
          call.input(randomTensor(c.in, 5)).attr("index", c.index).attr("count", c.count).output(plan::F32, c.out);
          return call;
        },
        "microbatch " + shapeText(c.in) + " -> " + shapeText(c.out));
}

TEST(CudaSliceFeatures, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  // Mamba-2-like parts over 2 and 4 ranks: each rank's share, and the share put back in place.
  const std::vector<int64_t> pieces = {64, 64, 16, 16, 8};
  for (int64_t ranks : {2, 4})
    for (int64_t index = 0; index < ranks; ++index) {
      auto forward = [&] {
        KernelCall call(registry(), "tp_slice_features");
        call.input(randomTensor({37, 168}, 7))
            .attr("pieces", pieces)
            .attr("ranks", ranks)
            .attr("index", index)
            .attr("axis", "tp")
            .output(plan::F32, {37, 168 / ranks});
        return call;
      };
      std::string what = "tp_slice_features rank " + std::to_string(index) + " of " + std::to_string(ranks);
      expectMatchesCpu(forward, what);
      expectMatchesCpu(
          [&] {
            KernelCall place(registry(), "tp_place_features");
            place.input(randomTensor({37, 168 / ranks}, 8)).attributes() = forward().attributes();
            place.output(plan::F32, {37, 168});
            return place;
          },
          "tp_place_features rank " + std::to_string(index) + " of " + std::to_string(ranks));
    }
}

TEST(CudaTokenBlocks, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  // An MoE block's hidden rows in two blocks (4096 tokens) and uneven ones (1001 rows in 3),
  // then the blocks joined again.
  for (const auto &[rows, blocks] : std::vector<std::pair<int64_t, int64_t>>{{4096, 2}, {1001, 3}}) {
    expectMatchesCpu(
        [&, rows = rows, blocks = blocks] {
          KernelCall call(registry(), "token_blocks");
          call.input(randomTensor({rows, 64}, 6));
          for (int64_t b = 0; b < blocks; ++b)
            call.output(plan::F32, {(b + 1) * rows / blocks - b * rows / blocks, 64});
          return call;
        },
        "token_blocks " + std::to_string(rows) + " rows in " + std::to_string(blocks));
    expectMatchesCpu(
        [&, rows = rows, blocks = blocks] {
          KernelCall call(registry(), "concat_tokens");
          for (int64_t b = 0; b < blocks; ++b)
            call.input(randomTensor({(b + 1) * rows / blocks - b * rows / blocks, 64}, 7 + static_cast<uint64_t>(b)));
          call.output(plan::F32, {rows, 64});
          return call;
        },
        "concat_tokens " + std::to_string(rows) + " rows from " + std::to_string(blocks));
  }
}

TEST(CudaSplit, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const SplitCase &c : kSplitCases)
    expectMatchesCpu([&] { return splitCall(c.rows, c.sizes, c.groups); }, name(c));
}

TEST(CudaSplit, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const SplitCase &c : kSplitCases) {
    int64_t parts = static_cast<int64_t>(c.sizes.size());
    // Every result's gradient, only the last one, only result 1, none.
    std::vector<std::vector<int64_t>> given = {{}, {parts - 1}, {1}, {}};
    for (int64_t i = 0; i < parts; ++i)
      given[0].push_back(i);
    for (const std::vector<int64_t> &results : given)
      expectMatchesCpu(
          [&] {
            KernelCall forward = splitCall(c.rows, c.sizes, c.groups);
            std::vector<std::pair<int64_t, OwnedTensor>> grads;
            for (int64_t i : results)
              grads.push_back({i, randomTensor({c.rows, c.groups * c.sizes[i]}, 16 + i)});
            return backwardOf(forward, {0}, grads);
          },
          name(c) + " backward with the gradients of results " + shapeText(results));
  }
}

TEST(CudaFill, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (double value : {1.0, -2.5})
    for (const std::vector<int64_t> &shape :
         std::vector<std::vector<int64_t>>{{}, {3, 4}, {1000, 7}})
      expectMatchesCpu(
          [&] {
            KernelCall call(registry(), "fill");
            call.attr("value", value).output(plan::F32, shape);
            return call;
          },
          "fill " + std::to_string(value) + " " + shapeText(shape));
}

//===----------------------------------------------------------------------===//
// accumulate_grad adds into its output, which the comparison harness poisons:
// it runs on hand-made device buffers.
//===----------------------------------------------------------------------===//

uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1); // round to nearest even (finite values)
  return static_cast<uint16_t>(bits >> 16);
}

float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// Host values stored as `dtype`: the bytes, and the values the device sees.
std::vector<uint8_t> store(const std::vector<float> &values, plan::DType dtype,
                           std::vector<float> &seen) {
  seen = values;
  if (dtype == plan::F32) {
    std::vector<uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    half[i] = toBf16(values[i]);
    seen[i] = fromBf16(half[i]);
  }
  std::vector<uint8_t> bytes(values.size() * 2);
  std::memcpy(bytes.data(), half.data(), bytes.size());
  return bytes;
}

TEST(CudaAccumulateGrad, AddsIntoTheAccumulator) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> shape = {33, 100};
  const int64_t n = 33 * 100;
  for (plan::DType accType : {plan::F32, plan::BF16})
    for (plan::DType gradType : {plan::F32, plan::BF16}) {
      std::vector<float> acc0, grad0;
      std::vector<uint8_t> accBytes = store(randomTensor(shape, 20).floats(), accType, acc0);
      std::vector<uint8_t> gradBytes = store(randomTensor(shape, 21).floats(), gradType, grad0);
      void *accDevice = nullptr, *gradDevice = nullptr;
      ASSERT_EQ(cudaMalloc(&accDevice, accBytes.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&gradDevice, gradBytes.size()), cudaSuccess);
      cudaMemcpy(accDevice, accBytes.data(), accBytes.size(), cudaMemcpyHostToDevice);
      cudaMemcpy(gradDevice, gradBytes.data(), gradBytes.size(), cudaMemcpyHostToDevice);
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      google::protobuf::Map<std::string, plan::Attr> attrs;
      KernelContext ctx;
      ctx.kernel = "accumulate_grad";
      ctx.inputs = {TensorRef{gradType, shape, gradDevice}};
      ctx.outputs = {TensorRef{accType, shape, accDevice}};
      ctx.attrs = &attrs;
      ctx.seqLen = 33;
      ctx.microBatch = 1;
      ctx.stream = stream;
      const KernelFn *fn = cudaRegistry().find("accumulate_grad");
      ASSERT_NE(fn, nullptr);
      std::string error;
      try {
        (*fn)(ctx); // twice: acc + g + g
        (*fn)(ctx);
      } catch (const KernelError &e) {
        error = e.what();
      }
      EXPECT_EQ(error, "");
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaStreamDestroy(stream);
      std::vector<uint8_t> result(accBytes.size());
      cudaMemcpy(result.data(), accDevice, result.size(), cudaMemcpyDeviceToHost);
      cudaFree(accDevice);
      cudaFree(gradDevice);
      // f32 additions, each rounded to the accumulator's storage type.
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        float want = acc0[i];
        for (int step = 0; step < 2; ++step) {
          want = want + grad0[i];
          if (accType == plan::BF16)
            want = fromBf16(toBf16(want));
        }
        float got;
        if (accType == plan::F32)
          std::memcpy(&got, result.data() + 4 * i, 4);
        else
          got = fromBf16(reinterpret_cast<const uint16_t *>(result.data())[i]);
        wrong += got != want;
      }
      EXPECT_EQ(wrong, 0) << "accumulator " << (accType == plan::BF16 ? "bf16" : "f32")
                          << ", gradient " << (gradType == plan::BF16 ? "bf16" : "f32");
    }
}

} // namespace
} // namespace moec::runtime::cuda::core::testing
