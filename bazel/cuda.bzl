"""cuda_library: .cu files compiled by nvcc, wrapped in a cc_library.

Bazel 4.2 has no CUDA rules, so each .cu file gets a genrule running @cuda's nvcc (its host
compiler is the system g++) into a position-independent .o. The objects become the srcs of a
cc_library that links cudart statically, so a binary needs only the driver at run time.

nvcc is not a Bazel toolchain and cannot see the include paths of `deps`; a small rule writes
them (and the cudart headers') to an nvcc options file and hands over their headers as inputs.
"""

NVCC_FLAGS = "-O3 -std=c++17 -Xcompiler -fPIC"

# Hopper (H200) only; add -gencode pairs here when another GPU generation must run the code.
SM90 = "-gencode=arch=compute_90,code=sm_90"

# Hopper with its architecture-specific instructions (wgmma, setmaxnreg): runs on sm_90 GPUs only.
SM90A = "-gencode=arch=compute_90a,code=sm_90a"

_CUDA_DEPS = ["@cuda//:cudart_static", "@cuda//:headers"]

def _nvcc_includes_impl(ctx):
    contexts = [d[CcInfo].compilation_context for d in ctx.attr.deps]
    dirs = depset(transitive = [c.includes for c in contexts] + [c.quote_includes for c in contexts])
    system_dirs = depset(transitive = [c.system_includes for c in contexts])
    ctx.actions.write(
        ctx.outputs.out,
        "".join(["-I %s\n" % d for d in dirs.to_list()] +
                ["-isystem %s\n" % d for d in system_dirs.to_list()]),
    )
    return [
        DefaultInfo(files = depset([ctx.outputs.out])),
        OutputGroupInfo(headers = depset(transitive = [c.headers for c in contexts])),
    ]

# Options file of -I/-isystem flags for the transitive `deps`; output group `headers` holds
# their header files, which the genrules need as inputs inside the sandbox.
_nvcc_includes = rule(
    implementation = _nvcc_includes_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "out": attr.output(mandatory = True),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], gencode = SM90, **kwargs):
    """Compiles the .cu files of `srcs` with nvcc; other srcs are private headers.

    Args:
      name: the cc_library; link it like any other.
      srcs: .cu files, plus private headers (.cuh, .h) they include; only nvcc sees those.
      hdrs: public headers, included as "path/from/workspace/root.h" (nvcc gets `-I .`).
      deps: cc_library targets whose headers the .cu files include; also linked.
      copts: extra nvcc flags, appended after NVCC_FLAGS.
      gencode: the GPU target (SM90, or SM90A for wgmma).
      **kwargs: passed to the cc_library (visibility, tags, testonly, ...).
    """
    cu_srcs = [s for s in srcs if s.endswith(".cu")]
    private_hdrs = [s for s in srcs if not s.endswith(".cu")]
    all_deps = deps + _CUDA_DEPS

    _nvcc_includes(name = name + "_nvcc_includes", deps = all_deps, out = name + "_nvcc_includes.txt")
    native.filegroup(
        name = name + "_dep_hdrs",
        srcs = [":%s_nvcc_includes" % name],
        output_group = "headers",
    )

    objects = []
    for src in cu_srcs:
        obj = "%s_cuda_objs/%s.o" % (name, src[:-len(".cu")])
        native.genrule(
            name = "%s_nvcc_%s" % (name, src[:-len(".cu")].replace("/", "_")),
            srcs = [src, ":%s_nvcc_includes" % name, ":%s_dep_hdrs" % name] + hdrs + private_hdrs,
            outs = [obj],
            tools = ["@cuda//:nvcc", "@cuda//:nvcc_files"],
            cmd = " ".join([
                "$(location @cuda//:nvcc)",
                NVCC_FLAGS,
                gencode,
                "-I . -I $(GENDIR)",
                "--options-file $(location :%s_nvcc_includes)" % name,
            ] + copts + ["-c $(location %s) -o $@" % src]),
            message = "Compiling CUDA %s" % src,
        )
        objects.append(obj)

    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        linkstatic = 1,
        deps = all_deps,
        **kwargs
    )
