"""driftkv.ShardedClient: one client over N driftkv-server replicas, each
sequence pinned to one replica by rendezvous hashing of its sequence_id;
the Python twin of client/sharded_client.h (docs/operations.md, "Scale
out").

Invariants (the same as the C++ client's, so that both route alike):
  - The owner of a sequence is argmax over replica names r of
    rendezvous_score(r, id), ties to the smaller name. It depends only on
    the id and the SET of names (not their order), so every client given
    the same names, spelled alike, routes the same way.
  - rendezvous_score(r, id) = mix64(fnv1a64(r + b"\\0" + id)): FNV-1a 64 over
    the UTF-8 bytes of the name, one zero byte and the id, then the
    SplitMix64 finaliser. tests/sharded_client_test.cc and
    python/tests/test_sharded.py pin the same values.
  - Removing a replica moves exactly its sequences; adding one moves to it
    only the sequences it now wins.
  - Prefixes across replicas: fork_from_prefix asks every replica
    (lookup_all), takes the one holding the longest prefix (ties to the
    lower index) and forks there under the first of base, base~1,
    base~2, ... that it owns (sequence_id_on), the ids the C++ client
    derives too.
  - Nothing moves data between replicas. A replica that is down fails the
    calls of its own sequences (UNAVAILABLE after its client's retries);
    every other sequence keeps working. Errors name the replica:
    "replica NAME: ...", and DriftkvError.replica is NAME.

Thread-safe: one ShardedClient may be shared by many threads.
"""
import functools
import threading
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar, Union

import grpc

from driftkv import _validate as V
from driftkv import _wire as W
from driftkv._errors import DriftkvError, closed_error, invalid
from driftkv._proto import pb
from driftkv._types import (AppendResult, Array, AttendItem, AttendResult, Attention, Chunk, ForkResult, Info,
                            LayerLength, LookupResult, ReadResult, ReleaseResult, Stats)
from driftkv._wire import Progress
from driftkv.client import Client

_MASK = (1 << 64) - 1
FNV_OFFSET_BASIS = 0xcbf29ce484222325
_FNV_PRIME = 0x100000001b3
# Owners remembered per Router (a decode loop asks for the same ids every
# step); 2^16 ids of ~40 bytes are a few MiB.
_OWNER_CACHE = 1 << 16

T = TypeVar("T")


def fnv1a64(data: bytes, state: int = FNV_OFFSET_BASIS) -> int:
    """FNV-1a 64 of `data`, continuing from `state`."""
    for c in data:
        state = ((state ^ c) * _FNV_PRIME) & _MASK
    return state


def mix64(x: int) -> int:
    """The SplitMix64 finaliser: a bijection of 64 bits with full avalanche."""
    x ^= x >> 30
    x = (x * 0xbf58476d1ce4e5b9) & _MASK
    x ^= x >> 27
    x = (x * 0x94d049bb133111eb) & _MASK
    x ^= x >> 31
    return x


def rendezvous_score(replica: str, sequence_id: str) -> int:
    """The weight of `replica` for `sequence_id` (an unsigned 64-bit int)."""
    return mix64(fnv1a64(sequence_id.encode(), fnv1a64(replica.encode() + b"\0")))


def rendezvous_owner(replicas: Sequence[str], sequence_id: str) -> int:
    """The index in `replicas` of the owner of `sequence_id`; -1 when empty."""
    best, best_score = -1, 0
    for i, r in enumerate(replicas):
        s = rendezvous_score(r, sequence_id)
        if best < 0 or s > best_score or (s == best_score and r < replicas[best]):
            best, best_score = i, s
    return best


def split_replicas(text: str) -> List[str]:
    """a:1,b:2, c:3" -> ["a:1", "b:2", "c:3"] (empty entries dropped)."""
    return [r.strip() for r in text.split(",") if r.strip()]


class Router:
    """The owner of each sequence among fixed replica names, and the split
    of a list of calls by owner. Shared by the sync and asyncio clients."""

    def __init__(self, replicas: Sequence[str]):
        self.replicas = list(replicas)
        if len(set(self.replicas)) != len(self.replicas):
            raise invalid(f"replica names must be distinct: {self.replicas}")
        # FNV state after each name and its zero byte: only the id is hashed per call.
        self._prefix = [fnv1a64(r.encode() + b"\0") for r in self.replicas]
        self.owner = functools.lru_cache(maxsize=_OWNER_CACHE)(self._owner)

    def _owner(self, sequence_id: str) -> int:
        if not self.replicas:
            raise DriftkvError(grpc.StatusCode.FAILED_PRECONDITION, "ShardedClient has no replicas")
        data = sequence_id.encode()
        best, best_score = -1, 0
        for i, prefix in enumerate(self._prefix):
            s = mix64(fnv1a64(data, prefix))
            if best < 0 or s > best_score or (s == best_score and self.replicas[i] < self.replicas[best]):
                best, best_score = i, s
        return best

    def split(self, sequence_ids: Iterable[str]) -> Dict[int, List[int]]:
        """replica -> the positions of its sequences, in order; replicas in
        ascending order."""
        groups: Dict[int, List[int]] = {}
        for k, s in enumerate(sequence_ids):
            groups.setdefault(self.owner(s), []).append(k)
        return dict(sorted(groups.items()))

    def sequence_id_on(self, base: str, replica: int) -> str:
        """The first of base, base~1, base~2, ... that `replica` owns: each
        candidate is its with probability 1/N, so N tries are expected and
        64 N fail with probability below e^-64 (then the last is returned)."""
        if not 0 <= replica < len(self.replicas):
            raise invalid(f"replica {replica} is not in [0, {len(self.replicas)})")
        k = 0
        while True:
            candidate = base if k == 0 else f"{base}~{k}"
            if self.owner(candidate) == replica or k >= 64 * len(self.replicas):
                return candidate
            k += 1

    def named(self, replica: int, error: DriftkvError) -> DriftkvError:
        """`error` with "replica NAME: " before its details."""
        if error.replica is not None:
            return error
        return DriftkvError(error.code, f"replica {self.replicas[replica]}: {error.details}",
                            replica=self.replicas[replica])


def _concurrently(indexes: Sequence[int], fn: Callable[[int], T]) -> Dict[int, Union[T, DriftkvError]]:
    """fn(i) for every i at once: one on the calling thread, the others on
    threads of their own (a call waits for the network; the same rule as
    the C++ client). A DriftkvError becomes that index's result; any other
    exception is raised after every thread ended."""
    out: Dict[int, Union[T, DriftkvError]] = {}
    other: List[BaseException] = []

    def run(i):
        try:
            out[i] = fn(i)
        except DriftkvError as e:
            out[i] = e
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            other.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in indexes[1:]]
    for t in threads:
        t.start()
    if indexes:
        run(indexes[0])
    for t in threads:
        t.join()
    if other:
        raise other[0]
    return out


def scatter_attend(router: Router, n: int, groups: Dict[int, List[int]],
                   answers: Dict[int, Union["pb.AttendResponse", DriftkvError]]) -> Tuple[list, list]:
    """Per-replica answers back in request order: (results, errors), each of
    length n; results[i] a pb.AttendResult or None, errors[i] a DriftkvError
    (named) or None."""
    results: list = [None] * n
    errors: list = [None] * n
    for r, where in groups.items():
        a = answers[r]
        if not isinstance(a, DriftkvError) and len(a.results) != len(where):
            a = DriftkvError(grpc.StatusCode.INTERNAL, f"{len(a.results)} results for {len(where)} items")
        for k, i in enumerate(where):
            if isinstance(a, DriftkvError):
                errors[i] = router.named(r, a)
            else:
                results[i] = a.results[k]
    return results, errors


def each_result(items: Sequence[AttendItem], results: list, errors: list,
                output_dtype: str = "f32") -> List[Union[AttendResult, DriftkvError]]:
    """AttendResult per answered item, the DriftkvError of the others."""
    out: List[Union[AttendResult, DriftkvError]] = list(errors)
    answered = [i for i in range(len(items)) if errors[i] is None]
    if answered:
        response = pb.AttendResponse()
        response.results.extend(results[i] for i in answered)
        for i, r in zip(answered, W.attend_results([items[i] for i in answered], response, output_dtype)):
            out[i] = r
    return out


def attend_plan(items, out, lse, output_dtype: Optional[str], wire_dtype: Optional[str]) -> W.AttendPlan:
    """The AttendPlan of a sharded attend: AttendItems only (a ready
    pb.AttendRequest has no owner to route by), every item checked before
    any replica is sent its part."""
    if isinstance(items, pb.AttendRequest):
        raise invalid("a ShardedClient routes AttendItems; send a pb.AttendRequest through one replica's client")
    return W.AttendPlan(items, out, lse, output_dtype, wire_dtype)


def all_or_nothing(results: list, errors: list) -> "pb.AttendResponse":
    """The answers as one response; raises the first failed item's error."""
    for e in errors:
        if e is not None:
            raise e
    response = pb.AttendResponse()
    response.results.extend(results)
    return response


def grouped_chunks(router: Router, chunks: Iterable[Chunk]) -> Dict[int, List[Chunk]]:
    """The chunks by owner, every one checked before any replica is sent
    its group."""
    chunks = V.chunks(list(chunks))
    return {r: [chunks[k] for k in where] for r, where in router.split(c.sequence_id for c in chunks).items()}


class ProgressSum:
    """progress(chunks, tokens) over every replica's Append, from the
    per-replica progress callbacks (called from several threads)."""

    def __init__(self, progress: Optional[Progress]):
        self._progress = progress
        self._lock = threading.Lock()
        self._total = [0, 0]
        self._each: Dict[int, Tuple[int, int]] = {}

    def of(self, replica: int) -> Optional[Progress]:
        if self._progress is None:
            return None

        def report(chunks: int, tokens: int) -> None:
            with self._lock:
                c, t = self._each.get(replica, (0, 0))
                self._total[0] += chunks - c
                self._total[1] += tokens - t
                self._each[replica] = (chunks, tokens)
                self._progress(*self._total)
        return report


def summed(parts: Iterable[AppendResult]) -> AppendResult:
    total = AppendResult(0, 0, 0)
    for p in parts:
        total = AppendResult(*(a + b for a, b in zip(total, p)))
    return total


class PrefixFork(NamedTuple):
    """A sequence a sharded client made from the longest prefix a replica
    holds: its id (derived from the base asked for), that replica's index
    and the Fork's result (`tokens`: append from there)."""
    sequence_id: str
    replica: int
    result: ForkResult


def longest_prefix(answers: Sequence[Union[LookupResult, DriftkvError]]) -> int:
    """The index of the answer holding the most tokens in every layer (ties
    to the lower index); -1 when none holds a page (errors count as none)."""
    best, most = -1, 0
    for r, a in enumerate(answers):
        if isinstance(a, LookupResult) and a.tokens > most:
            best, most = r, a.tokens
    return best


def prefix_target(router: Router, answers: Sequence[Union[LookupResult, DriftkvError]], base: str) -> Tuple[int, str]:
    """fork_from_prefix's replica and sequence id; NOT_FOUND naming each
    replica's reason when none holds a page of the prompt."""
    best = longest_prefix(answers)
    if best < 0:
        why = "; ".join(f"{name}: {a.miss_message if isinstance(a, LookupResult) else a.details}"
                        for name, a in zip(router.replicas, answers))
        raise DriftkvError(grpc.StatusCode.NOT_FOUND, f"no replica holds a page of the prompt ({why})")
    return best, router.sequence_id_on(base, best)


class ReplicaClients:
    """The routing state a sharded client has, sync or asyncio: the Router
    over the replicas' names and one client per replica (made with
    `client_type` from the names and `client_options`, or given)."""

    def __init__(self, replicas: Sequence[str], client_type: type, clients: Optional[Sequence] = None,
                 client_options: Optional[dict] = None):
        self._router = Router(replicas)
        if clients is None:
            clients = [client_type(r, **(client_options or {})) for r in self._router.replicas]
        elif len(clients) != len(self._router.replicas):
            raise invalid(f"{len(clients)} clients for {len(self._router.replicas)} replicas")
        self._clients = list(clients)
        self._closed = False

    def __repr__(self) -> str:
        kind = f"{type(self).__module__.replace('.sharded', '')}.{type(self).__name__}"
        return f"<{kind} replicas={self._router.replicas!r} {'closed' if self._closed else 'open'}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self)

    @property
    def replicas(self) -> List[str]:
        return list(self._router.replicas)

    def replica_of(self, sequence_id: str) -> int:
        """The index in `replicas` of the replica that holds `sequence_id`."""
        return self._router.owner(V.text(sequence_id, "sequence_id"))

    def sequence_id_on(self, base: str, replica: int) -> str:
        """The first of base, base~1, base~2, ... that replica `replica`
        owns (what fork_from_prefix names its sequences)."""
        return self._router.sequence_id_on(V.text(base, "base"), replica)

    def client(self, replica: int):
        """The client of replica `replica`."""
        return self._clients[replica]

    def client_of(self, sequence_id: str):
        """The client of the sequence's owner (e.g. to stream one sequence's
        chunks while its prefill runs: append_chunks of the sharded clients
        reads its iterable to the end first)."""
        return self._clients[self.replica_of(sequence_id)]


class ShardedClient(ReplicaClients):
    """driftkv.Client over replicas; every per-sequence call goes to the
    sequence's owner.

    replicas: the replicas' names, which are also their targets
    ("driftkv-server-0.driftkv-headless.ns.svc.cluster.local:50051"); every
    client must spell them alike. The other arguments are driftkv.Client's,
    given to each replica's client. clients: existing clients instead, one
    per name, named for hashing by `replicas` (tests, or targets that differ
    from the shared names); the ShardedClient closes them.
    """

    def __init__(self, replicas: Sequence[str], *, clients: Optional[Sequence[Client]] = None, **client_options):
        super().__init__(replicas, Client, clients, client_options)

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Closes every replica's client (see driftkv.Client.close): final,
        idempotent."""
        self._closed = True
        for c in self._clients:
            c.close()

    def _routed(self, sequence_id: str, call: Callable):
        self._check_open()
        r = self.replica_of(sequence_id)
        try:
            return call(self._clients[r])
        except DriftkvError as e:
            raise self._router.named(r, e) from None

    # -- per sequence, at its owner ------------------------------------------

    def append(self, sequence_id: str, layer: int, keys, values, **kwargs) -> AppendResult:
        """driftkv.Client.append at the sequence's owner."""
        return self._routed(sequence_id, lambda c: c.append(sequence_id, layer, keys, values, **kwargs))

    def read(self, sequence_id: str, layer: int, **kwargs) -> ReadResult:
        return self._routed(sequence_id, lambda c: c.read(sequence_id, layer, **kwargs))

    def length(self, sequence_id: str, **kwargs) -> List[LayerLength]:
        """Each layer's stored tokens, from the owner (NOT_FOUND there when it
        does not hold the sequence: restarted, or another replica list)."""
        return self._routed(sequence_id, lambda c: c.length(sequence_id, **kwargs))

    def release(self, sequence_id: str, **kwargs) -> ReleaseResult:
        return self._routed(sequence_id, lambda c: c.release(sequence_id, **kwargs))

    # -- spread over replicas ------------------------------------------------

    def append_chunks(self, chunks: Iterable[Chunk], *, progress: Optional[Progress] = None,
                      timeout: Optional[float] = None) -> AppendResult:
        """Chunks grouped by owner (each group in its original order), one
        Append call per replica, concurrently; the results summed. Reads the
        iterable to the end first. On failure raises the first failed
        replica's error (in replica order), named; the other replicas'
        chunks were stored (resend: Append is idempotent). progress(chunks,
        tokens) counts over all replicas. Every chunk is checked before any
        is sent (a bad one raises DriftkvError(INVALID_ARGUMENT))."""
        self._check_open()
        groups = grouped_chunks(self._router, chunks)
        total = ProgressSum(progress)
        answers = _concurrently(list(groups), lambda r: self._clients[r].append_chunks(
            groups[r], progress=total.of(r), timeout=timeout))
        for r in groups:
            if isinstance(answers[r], DriftkvError):
                raise self._router.named(r, answers[r])
        return summed(answers.values())

    def _attend(self, batch: List[AttendItem], wire_dtype, timeout, dests=None,
                output_dtype: str = "f32") -> Tuple[list, list]:
        """The per-replica calls of a batch checked already (AttendPlan,
        results_batch): a bad item never lets another replica's part go."""
        self._check_open()
        V.timeout(timeout)
        groups = self._router.split(it.sequence_id for it in batch)
        # Each replica's client sends by reference what lies in its own
        # regions; the rest of a sub-batch goes inline.
        answers = _concurrently(list(groups), lambda r: self._clients[r]._attend(
            [batch[i] for i in groups[r]], wire_dtype, timeout,
            None if dests is None else [dests[i] for i in groups[r]], output_dtype))
        return scatter_attend(self._router, len(batch), groups, answers)

    def attend_each(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                    output_dtype: str = "f32", timeout: Optional[float] = None) -> List[Union[AttendResult,
                                                                                                DriftkvError]]:
        """The batch split by owner, the sub-batches sent concurrently, one
        entry per item in request order: its AttendResult, or the
        DriftkvError of its replica's sub-batch (a batch is all-or-nothing on
        one replica, so one bad item fails the items that share its replica;
        a replica down fails its items with UNAVAILABLE). The C++
        ShardedClient::AttendEach. A batch the client can refuse (checked
        before anything is sent) raises DriftkvError(INVALID_ARGUMENT)."""
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return each_result(batch, *self._attend(batch, wire_dtype, timeout, None, output_dtype), output_dtype)

    def attend(self, items: Union[AttendItem, Sequence[AttendItem]], *, wire_dtype: Optional[str] = None,
               out: Optional[Array] = None, lse: Optional[Array] = None, output_dtype: Optional[str] = None,
               timeout: Optional[float] = None) -> Attention:
        """driftkv.Client.attend over the replicas (out, lse and
        output_dtype as there), all or nothing: raises the first failed
        item's error. Destinations in registered memory of the replicas that
        answered may have been written even when the call raises."""
        plan = attend_plan(items, out, lse, output_dtype, wire_dtype)
        return plan.finish(all_or_nothing(*self._attend(plan.batch, wire_dtype, timeout, plan.dests,
                                                        plan.output_dtype)))

    def attend_results(self, items: Sequence[AttendItem], *, wire_dtype: Optional[str] = None,
                       output_dtype: str = "f32", timeout: Optional[float] = None) -> List[AttendResult]:
        """Like attend, one AttendResult per item, all or nothing."""
        batch = W.results_batch(items, wire_dtype, output_dtype)
        return W.attend_results(batch, all_or_nothing(*self._attend(batch, wire_dtype, timeout, None, output_dtype)),
                                output_dtype)

    # -- every replica -------------------------------------------------------

    def _all(self, fn: Callable) -> list:
        self._check_open()
        answers = _concurrently(list(range(len(self._clients))), lambda r: fn(self._clients[r]))
        return [self._router.named(r, a) if isinstance(a, DriftkvError) else a for r, a in sorted(answers.items())]

    def info_all(self, *, timeout: Optional[float] = None) -> List[Union[Info, DriftkvError]]:
        """Every replica's Info (or its error), in replica order."""
        V.timeout(timeout)
        return self._all(lambda c: c.info(timeout=timeout))

    def stats_all(self, *, timeout: Optional[float] = None) -> List[Union[Stats, DriftkvError]]:
        """Every replica's Stats (or its error), in replica order."""
        V.timeout(timeout)
        return self._all(lambda c: c.stats(timeout=timeout))

    def lookup_all(self, token_ids: Optional[Sequence[int]] = None, *, page_keys: Optional[Sequence[bytes]] = None,
                   timeout: Optional[float] = None) -> List[Union[LookupResult, DriftkvError]]:
        """Every replica's Lookup of the prompt (or its error), in replica
        order: which replica holds how much of it (driftkv.Client.lookup)."""
        V.timeout(timeout)
        return self._all(lambda c: c.lookup(token_ids, page_keys=page_keys, timeout=timeout))

    def fork_from_prefix(self, base: str, token_ids: Optional[Sequence[int]] = None, *,
                         page_keys: Optional[Sequence[bytes]] = None, max_tokens: int = 0,
                         timeout: Optional[float] = None) -> PrefixFork:
        """A new sequence sharing the longest prefix of the prompt that any
        replica holds: lookup_all, then driftkv.Client.fork_from_prefix on
        that replica under sequence_id_on(base, it), an id every later call
        routes there. NOT_FOUND when no replica holds a page of the prompt
        (then append to `base` itself); a replica whose Lookup fails is
        left out. Never retried."""
        best, sequence_id = prefix_target(self._router, self.lookup_all(token_ids, page_keys=page_keys,
                                                                         timeout=timeout), V.text(base, "base"))
        result = self._routed(sequence_id, lambda c: c.fork_from_prefix(
            sequence_id, token_ids, page_keys=page_keys, max_tokens=max_tokens, timeout=timeout))
        return PrefixFork(sequence_id, best, result)
