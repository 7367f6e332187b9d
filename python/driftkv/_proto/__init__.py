"""The generated stubs of proto/driftkv.proto (private: use driftkv.Client).

`python/gen_stubs.sh` writes driftkv_pb2.py and driftkv_pb2_grpc.py here;
a build may put them in another `driftkv/_proto` folder on sys.path
instead (Bazel's //python:stubs), which extend_path adds to this package
(and to driftkv's, in driftkv/__init__.py).
"""
import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)

try:
    from driftkv._proto import driftkv_pb2 as pb  # noqa: F401
    from driftkv._proto import driftkv_pb2_grpc as pb_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "driftkv: the gRPC stubs are not generated; run python/gen_stubs.sh "
        "(needs Debian's protobuf-compiler and protobuf-compiler-grpc; "
        f"tools/install_deps.sh installs them): {e}") from e
