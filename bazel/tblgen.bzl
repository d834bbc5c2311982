"""gentbl_cc_library with upstream's list-of-tuples signature, run through genrules."""

def gentbl_cc_library(name, td_file, tbl_outs, td_srcs = [], deps = [], tblgen = "@llvm-project//mlir:mlir-tblgen", **kwargs):
    outs = []
    for opts, out in tbl_outs:
        native.genrule(
            name = "%s_%s_genrule" % (name, out.replace("/", "_").replace(".", "_")),
            srcs = [td_file] + td_srcs + ["@llvm-project//:td_files"],
            outs = [out],
            tools = [tblgen],
            cmd = ("$(location %s) %s -I external/llvm-project/include " % (tblgen, " ".join(opts)) +
                   "-I $$(dirname $(location %s)) -I . $(location %s) -o $@" % (td_file, td_file)),
        )
        outs.append(out)
    native.cc_library(
        name = name,
        textual_hdrs = outs,
        deps = deps,
        **kwargs
    )
