//===- CopyBlocks.h - many device copies in one kernel ----------*- C++ -*-===//
//
// The CUDA device's copyBlocks: the expert exchange regroups rows per (rank,
// expert) segment, hundreds of them per exchange; one cudaMemcpyAsync each
// would cost more than the copies. Plain C++: callers need no CUDA headers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
#define RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_

#include <cstddef>
#include <string>
#include <vector>

namespace moec::runtime::cuda {

struct CopyBlock {
  size_t to, from, bytes;
};

/// Copies every block from `src` to `dst` on `stream` (a cudaStream_t) with one kernel;
/// the block table goes to the device first (the call waits for that small upload). Returns
/// an empty string or the CUDA error.
std::string copyBlocksOnStream(void *dst, const void *src, const std::vector<CopyBlock> &blocks, void *stream);

} // namespace moec::runtime::cuda

#endif // RUNTIME_BACKENDS_CUDA_COPYBLOCKS_H_
