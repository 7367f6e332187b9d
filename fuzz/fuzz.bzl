"""driftkv_fuzz_target: one libFuzzer target and its corpus test.

Under --config=fuzz (.bazelrc: Debian's clang, -fsanitize=fuzzer-no-link,
address and undefined on every compile) the binary NAME links libFuzzer's
main (-fsanitize=fuzzer). Without it NAME links //fuzz:replay_main, which
runs the inputs named on its command line once each, so that the targets
build with gcc too. NAME_corpus_test always uses replay_main and replays
the committed seeds fuzz/corpus/NAME/ (a plain test under gcc, an ASan and
UBSan test under --config=fuzz).
"""

def driftkv_fuzz_target(name, srcs, deps):
    """Defines cc_binary NAME and cc_test NAME_corpus_test.

    Both link the target's sources from one cc_library, NAME_input, so
    that each configuration compiles them once.

    Args:
      name: the target's name, fuzz_*; its seeds are fuzz/corpus/NAME/.
      srcs: the sources, one of which defines LLVMFuzzerTestOneInput.
      deps: the cc_library targets the sources use.
    """
    native.cc_library(
        name = name + "_input",
        srcs = srcs,
        deps = deps,
        # Nothing in the library references its entry point: the mains
        # (libFuzzer's, replay_main) do, from outside it.
        alwayslink = True,
    )
    native.cc_binary(
        name = name,
        deps = [":" + name + "_input"] + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_corpus_test",
        deps = [":" + name + "_input", "//fuzz:replay_main"],
        data = native.glob(["corpus/" + name + "/*"]),
        args = ["fuzz/corpus/" + name],
        # The objects of the binary (no second, position-independent build
        # of every library under --config=fuzz).
        linkstatic = True,
        size = "small",
    )
