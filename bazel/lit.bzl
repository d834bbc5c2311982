"""One sh_test per lit file, plus a test_suite; a file list that drifts from the folder fails."""

def glob_lit_tests(name = "lit_tests", srcs = None, tools = [], cfg = "//tests:lit_cfg", data = [], tags = []):
    """Declares a test per .mlir file in this package.

    srcs: the explicit list of test files; when given it must equal glob(["*.mlir"]), so a
    file added to the folder but not to BUILD (or the reverse) fails the build.
    """
    found = native.glob(["*.mlir"])
    if srcs != None and sorted(srcs) != sorted(found):
        fail("lit test list of %s drifts from the folder: listed only %s, on disk only %s" % (
            native.package_name(),
            [s for s in srcs if s not in found],
            [f for f in found if f not in srcs],
        ))
    tests = []
    for f in sorted(found):
        test_name = f[:-len(".mlir")] + "_lit"
        native.sh_test(
            name = test_name,
            srcs = ["//bazel:run_lit.sh"],
            args = ["$(rootpath %s)" % f, "$(rootpath @llvm-project//llvm:lit)", "$(rootpath @llvm-project//llvm:FileCheck)", "$(rootpath @llvm-project//llvm:not)"] +
                   ["$(rootpath %s)" % t for t in tools],
            data = [f, cfg] + native.glob(["Inputs/**"]) + [ "@llvm-project//llvm:lit", "@llvm-project//llvm:FileCheck", "@llvm-project//llvm:not"] + tools + data,
            tags = tags,
        )
        tests.append(test_name)
    native.test_suite(name = name, tests = tests, tags = tags)
