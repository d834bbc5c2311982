//===- MoeOps.h - moe dialect ops -------------------------------*- C++ -*-===//

#ifndef DIALECTS_MOE_MOEOPS_H_
#define DIALECTS_MOE_MOEOPS_H_

#include "dialects/moe/MoeAttributes.h"
#include "dialects/moe/MoeDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/RegionKindInterface.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "dialects/moe/MoeOps.h.inc"

#endif // DIALECTS_MOE_MOEOPS_H_
