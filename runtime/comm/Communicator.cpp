//===- Communicator.cpp - shared helpers of the communicators ------------===//

#include "runtime/comm/Communicator.h"

namespace moec::runtime::comm {

size_t elementBytes(plan::DType dtype) {
  switch (dtype) {
  case plan::F32:
  case plan::I32:
    return 4;
  case plan::BF16:
  case plan::F16:
    return 2;
  case plan::I64:
    return 8;
  default:
    return 0;
  }
}

} // namespace moec::runtime::comm
