//===- RandomFill.h - random weights, the same on the CPU and the GPU -*- C++ -*-===//
//
// `fill_random` fills a weight buffer in place (`moe-run --random-weights`),
// so real-size models start on the GPU without tens of GB of files. Each
// element is a pure function of (stream, index): SplitMix64 of the tensor's
// stream and the element index, then the value by kind. The CPU and CUDA
// kernels include this header, so both backends make the same model.
//
// Attributes: `kind` ("normal", "zeros", "ones", "a_log", "dt_bias"), `std`
// (for normal), `stream` (an integer per tensor: the seed mixed with a hash
// of its name, computed by the host), `first_index` (0 unless the buffer is
// part of the tensor: an expert-parallel rank's experts are elements
// first_index.. of the whole tensor, so every mesh makes the same model), and for
// a window of columns (a tensor-parallel rank's part of a split tensor, seen as
// rows x columns) `columns` (default: the last dimension) of every row of
// `whole_columns`, from `first_column`.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_RANDOMFILL_H_
#define RUNTIME_KERNELS_RANDOMFILL_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MOEC_HOST_DEVICE __host__ __device__
#else
#define MOEC_HOST_DEVICE
#endif

namespace moec::runtime::random {

enum Kind : int { Normal = 0, Zeros = 1, Ones = 2, ALog = 3, DtBias = 4 };

MOEC_HOST_DEVICE inline uint64_t splitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Uniform in (0, 1): 53 bits, never 0 (log-safe).
MOEC_HOST_DEVICE inline double uniform(uint64_t stream, uint64_t counter) {
  return (static_cast<double>(splitMix64(stream ^ splitMix64(counter)) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

MOEC_HOST_DEVICE inline float value(int kind, double stddev, uint64_t stream, uint64_t index) {
  switch (kind) {
  case Zeros:
    return 0.0f;
  case Ones:
    return 1.0f;
  case ALog: // log(U[1, 16))
    return static_cast<float>(log(1.0 + 15.0 * uniform(stream, index)));
  case DtBias: { // softplus^-1(dt), dt log-uniform in [1e-3, 1e-1]
    double dt = exp(log(1e-3) + (log(1e-1) - log(1e-3)) * uniform(stream, index));
    return static_cast<float>(dt + log(-expm1(-dt)));
  }
  default: { // Box-Muller on two uniforms of this element
    double u1 = uniform(stream, 2 * index), u2 = uniform(stream, 2 * index + 1);
    return static_cast<float>(stddev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
  }
}

/// The index in the whole tensor of element i of a buffer: contiguous from `first`, or, with
/// wholeColumns > 0, `columns` of each row of `wholeColumns` starting at `firstColumn`.
MOEC_HOST_DEVICE inline uint64_t wholeIndex(uint64_t first, int64_t i, int64_t columns, int64_t wholeColumns,
                                            int64_t firstColumn) {
  if (wholeColumns <= 0)
    return first + static_cast<uint64_t>(i);
  return first + static_cast<uint64_t>((i / columns) * wholeColumns + firstColumn + i % columns);
}

} // namespace moec::runtime::random

#endif // RUNTIME_KERNELS_RANDOMFILL_H_
