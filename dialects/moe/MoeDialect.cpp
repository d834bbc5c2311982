//===- MoeDialect.cpp - the moe dialect -----------------------------------===//

#include "dialects/moe/MoeDialect.h"

#include "dialects/moe/MoeAttributes.h"
#include "dialects/moe/MoeOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialects/moe/MoeDialect.cpp.inc"

using namespace mlir;

namespace moec::moe {

void MoeDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/moe/MoeOps.cpp.inc"
      >();
}

} // namespace moec::moe
