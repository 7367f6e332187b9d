"""driftkv: the Python client of driftkv-server (driftkv.v1.KvCache), a
KV-cache service that stores keys and values compressed with D-Quant and
answers decode attention on them.

    import driftkv
    with driftkv.Client("127.0.0.1:50051") as c:
        c.append("seq", layer, keys, values)          # [tokens, kv_heads, head_dim]
        out, lse = c.attend([driftkv.AttendItem("seq", layer, query)])
        print(c.length("seq"))

numpy arrays in and out (torch tensors too when torch is importable),
deadlines and the retry rules of docs/api.md, channel limits sized from the
server's Info; driftkv.aio.Client is the asyncio variant.
driftkv.ShardedClient (and driftkv.aio.ShardedClient) spreads sequences over
several servers by rendezvous hashing, like the C++ one. docs/python.md is
the manual.
"""
import pkgutil

# Generated stubs may live in another driftkv/ folder on sys.path (see
# driftkv/_proto/__init__.py): both folders make up the package.
__path__ = pkgutil.extend_path(__path__, __name__)

from driftkv._errors import DriftkvError  # noqa: E402
from driftkv._retry import RetryPolicy
from driftkv._types import (AppendResult, AttendItem, AttendResult, Attention, Chunk, DeviceInfo, DeviceStats,
                            ForkResult, Info, LayerLength, LookupResult, PageEvent, PageEventBatch, PinResult,
                            ReadResult, ReleaseResult, Stats)
from driftkv.client import Client
from driftkv.merge import merge_attention
from driftkv.sharded import ShardedClient, rendezvous_owner, rendezvous_score, split_replicas

__version__ = "0.1.0"

__all__ = [
    "AppendResult", "AttendItem", "AttendResult", "Attention", "Chunk", "Client", "DeviceInfo", "DeviceStats",
    "DriftkvError", "ForkResult", "Info", "LayerLength", "LookupResult", "PageEvent", "PageEventBatch", "PinResult",
    "ReadResult", "ReleaseResult", "RetryPolicy", "ShardedClient", "Stats", "merge_attention",
    "rendezvous_owner", "rendezvous_score", "split_replicas",
]
