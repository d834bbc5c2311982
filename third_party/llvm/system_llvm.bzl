"""Exposes the Debian LLVM/MLIR 22 install as @llvm-project with upstream-shaped labels.

Only the two shared libraries are linked (libMLIR.so, libLLVM.so): mixing in the static
archives registers LLVM command-line options twice and aborts at start-up.
"""

_MLIR_LIBS = [
    "IR",
    "Pass",
    "Support",
    "Parser",
    "Transforms",
    "TransformUtils",
    "MlirOptLib",
    "FuncDialect",
    "ArithDialect",
    "TensorDialect",
    "SideEffectInterfaces",
    "InferTypeOpInterface",
    "ControlFlowInterfaces",
    "CallOpInterfaces",
    "FunctionInterfaces",
    "Rewrite",
    "AllPassesAndDialects",
]

_MLIR_TD = [
    "OpBaseTdFiles",
    "PassBaseTdFiles",
    "SideEffectInterfacesTdFiles",
    "InferTypeOpInterfaceTdFiles",
    "BuiltinDialectTdFiles",
    "SymbolInterfacesTdFiles",
    "ControlFlowInterfacesTdFiles",
    "CallInterfacesTdFiles",
    "FunctionInterfacesTdFiles",
]

def _system_llvm_impl(ctx):
    prefix = ctx.os.environ.get("LLVM_PREFIX", "/usr/lib/llvm-22")
    for required in ["lib/libMLIR.so.22.1", "lib/libLLVM.so.22.1", "bin/mlir-tblgen"]:
        if not ctx.path(prefix + "/" + required).exists:
            fail("%s/%s is missing: run bazel/setup.sh (installs libmlir-22-dev, mlir-22-tools, llvm-22-tools)" % (prefix, required))
    for d in ["include", "lib", "bin"]:
        ctx.symlink(prefix + "/" + d, d)
    ctx.file("WORKSPACE", 'workspace(name = "llvm-project")\n')
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
exports_files(glob(["bin/*"]))
cc_library(
    name = "headers",
    hdrs = glob(["include/llvm/**", "include/llvm-c/**", "include/mlir/**", "include/mlir-c/**"]),
    includes = ["include"],
)
cc_library(
    name = "dylibs",
    srcs = ["lib/libMLIR.so.22.1", "lib/libLLVM.so.22.1"],
    deps = [":headers"],
)
filegroup(
    name = "td_files",
    srcs = glob(["include/mlir/**/*.td", "include/llvm/**/*.td"]),
)
""")
    ctx.file("mlir/BUILD", "package(default_visibility = [\"//visibility:public\"])\n" +
                           "".join(['alias(name = "%s", actual = "//:dylibs")\n' % n for n in _MLIR_LIBS]) +
                           "".join(['alias(name = "%s", actual = "//:td_files")\n' % n for n in _MLIR_TD]) +
                           'alias(name = "mlir-tblgen", actual = "//:bin/mlir-tblgen")\n' +
                           'alias(name = "mlir-opt", actual = "//:bin/mlir-opt")\n')
    ctx.file("llvm/BUILD", """
package(default_visibility = ["//visibility:public"])
alias(name = "Support", actual = "//:dylibs")
alias(name = "FileCheck", actual = "//:bin/FileCheck")
alias(name = "not", actual = "//:bin/not")
alias(name = "lit", actual = "//:bin/lit")
alias(name = "count", actual = "//:bin/count")
""")

system_llvm = repository_rule(
    implementation = _system_llvm_impl,
    local = True,
    environ = ["LLVM_PREFIX"],
)
