//===- RoutingKernels.h - the CUDA routing kernels (internal) ---*- C++ -*-===//
//
// One file each: Router.cu, Dispatch.cu (dispatch and combine), ExpertMlp.cu;
// registered by RoutingCommon.cu under the CPU kernels' names.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGKERNELS_H_
#define RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGKERNELS_H_

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::cuda::routing {

void routerForward(KernelContext &ctx);
void routerBackward(KernelContext &ctx);
void dispatchForward(KernelContext &ctx);
void dispatchBackward(KernelContext &ctx);
void combineForward(KernelContext &ctx);
void combineBackward(KernelContext &ctx);
void expertMlpForward(KernelContext &ctx);
void expertMlpBackward(KernelContext &ctx);
void expertMlpCombineBackward(KernelContext &ctx);

} // namespace moec::runtime::cuda::routing

#endif // RUNTIME_KERNELS_CUDA_ROUTING_ROUTINGKERNELS_H_
