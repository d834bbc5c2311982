//===- MoeDialect.h - the moe dialect ---------------------------*- C++ -*-===//

#ifndef DIALECTS_MOE_MOEDIALECT_H_
#define DIALECTS_MOE_MOEDIALECT_H_

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dialect.h"

#include "dialects/moe/MoeDialect.h.inc"

#endif // DIALECTS_MOE_MOEDIALECT_H_
