"""cc_proto: C++ classes from one .proto file with Debian's protoc (no rules_proto offline)."""

def cc_proto(name, src, deps = [], **kwargs):
    """Generates <src>.pb.{h,cc} and a cc_library `name` linking Debian's libprotobuf.

    Include the header workspace-rooted: "runtime/plan/plan.pb.h".
    """
    base = src[:-len(".proto")]
    native.genrule(
        name = name + "_protoc",
        srcs = [src],
        outs = [base + ".pb.h", base + ".pb.cc"],
        tools = ["@system_libs//:bin/protoc"],
        cmd = "$(location @system_libs//:bin/protoc) --proto_path=. --cpp_out=$(GENDIR) $(location %s)" % src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        deps = deps + ["@system_libs//:protobuf"],
        **kwargs
    )
