"""driftkv_proto_library: protoc + grpc_cpp_plugin from Debian, no rules_proto.

Bazel 4.2.3 offline has no usable proto toolchain, so a genrule runs
/usr/bin/protoc with the gRPC C++ plugin and a cc_library wraps the output.
"""

def driftkv_proto_library(name, srcs, grpc = True, deps = [], testonly = False):
    """Generates <name> (a cc_library) from srcs (.proto files in this package).

    Args:
      name: the cc_library's name.
      srcs: .proto files; imports are resolved from the workspace root.
      grpc: also generate *.grpc.pb.{h,cc} for services.
      deps: other driftkv_proto_library targets whose protos srcs import.
      testonly: for protos used only by tests.
    """
    outs_h = []
    outs_cc = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs_h.append(base + ".pb.h")
        outs_cc.append(base + ".pb.cc")
        if grpc:
            outs_h.append(base + ".grpc.pb.h")
            outs_cc.append(base + ".grpc.pb.cc")
    grpc_flags = "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin " if grpc else ""
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs_h + outs_cc,
        cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR) " + grpc_flags + "$(SRCS)",
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = outs_cc,
        hdrs = outs_h,
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc++"] if grpc else []),
        copts = ["-Wno-unused-parameter"],
        testonly = testonly,
    )
