"""driftkv.ShardedClient (and driftkv.aio.ShardedClient) over three
driftkv-server processes on loopback, next to a fourth holding every
sequence; the bars of tests/sharded_client_test.cc (docs/operations.md,
"Scale out"):
  - the rendezvous hash is the C++ one (the same pinned values);
  - each replica holds its share of the sequences within +-15% of a third;
  - sharded, batched Attend (mixed batches, decode steps too), Read and
    Length are bit-equal to the single server's;
  - removing a replica from the list moves exactly its sequences;
  - a killed replica fails exactly its sequences (UNAVAILABLE, named), and
    every other sequence keeps working.
The replicas are NAMED like a StatefulSet's pods (fixed names, clients on the
loopback ports), so the split of the ids is the same in every run.
"""
import asyncio

import grpc
import numpy as np
import pytest

import driftkv
import driftkv.aio
from conftest import kv
from driftkv.local_server import LocalServer
from driftkv.sharded import fnv1a64, mix64

CONFIG = """
model { layers: 1 kv_heads: 2 head_dim: 64 }
codec { page_tokens: 32 }
pool_bytes: 16777216
window_tokens: 32
max_sequences: 1024
"""
NAMES = [f"driftkv-server-{r}.driftkv-headless:50051" for r in range(3)]
SEQUENCES = 600
BATCH = 64
RETRY = driftkv.RetryPolicy(max_attempts=2)  # a dead replica answers UNAVAILABLE after one retry


def sid(i):
    return f"seq-{i}"


def tokens_of(i):
    """A few tokens (bf16 window only); every tenth sequence 70, one page of
    32 compressed (the first page is made at 64 tokens)."""
    return 70 if i % 10 == 0 else 3 + i % 5


class Cluster:
    def __init__(self):
        self.servers = [LocalServer(config_text=CONFIG) for _ in range(4)]  # 0..2 replicas, 3 the single
        self.sharded = driftkv.ShardedClient(
            NAMES, clients=[driftkv.Client(s.target, timeout=20, retry=RETRY) for s in self.servers[:3]])
        self.single = driftkv.Client(self.servers[3].target, timeout=20, retry=RETRY)
        rng = np.random.default_rng(15)
        # Each sequence's tokens plus one more (a decode step's).
        self.kv = {i: kv(rng, tokens_of(i) + 1, kv_heads=2, head_dim=64) for i in range(SEQUENCES)}
        chunks = [driftkv.Chunk(sid(i), 0, 0, k[:-1], v[:-1], "bf16") for i, (k, v) in self.kv.items()]
        for b in range(0, len(chunks), 200):
            assert self.sharded.append_chunks(chunks[b:b + 200]).chunks == len(chunks[b:b + 200])
            self.single.append_chunks(chunks[b:b + 200])

    def query(self, i, seed):
        return np.random.default_rng(seed * 100003 + i).standard_normal((4, 64)).astype(np.float32)

    def batches(self, sequences, seed):
        """Batches of BATCH items over the sequences shuffled: every batch
        mixes the replicas."""
        order = np.random.default_rng(seed).permutation(sequences)
        return [[driftkv.AttendItem(sid(i), 0, self.query(i, seed)) for i in order[b:b + BATCH]]
                for b in range(0, len(order), BATCH)]

    def close(self):
        self.sharded.close()
        self.single.close()
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.close()


def same_bits(a, b):
    """Bit-equal AttendResults: output and lse bytes, token counts."""
    return (a.output.tobytes() == b.output.tobytes() and a.lse.tobytes() == b.lse.tobytes()
            and (a.tokens, a.compressed_tokens) == (b.tokens, b.compressed_tokens))


def test_rendezvous_hash_is_the_cpp_one():
    # FNV-1a 64 test vectors, then the values tests/sharded_client_test.cc pins.
    assert fnv1a64(b"") == 0xcbf29ce484222325
    assert fnv1a64(b"a") == 0xaf63dc4c8601ec8c
    assert fnv1a64(b"foobar") == 0x85944171f73967e8
    assert mix64(0) == 0
    assert driftkv.rendezvous_score("a:1", "seq-0") == 12193204044201198253
    assert driftkv.rendezvous_score("driftkv-server-0.driftkv-headless:50051", "req-42") == 2269833343191734746
    assert driftkv.rendezvous_score("a:1", "seq-0") == mix64(fnv1a64(b"a:1\0seq-0"))
    assert driftkv.split_replicas(" a:1,b:2,, c:3 ") == ["a:1", "b:2", "c:3"]


def test_owner_independent_of_order_and_moves_minimally_on_add():
    abc, cab, abcd = ["a:1", "b:1", "c:1"], ["c:1", "a:1", "b:1"], ["a:1", "b:1", "c:1", "d:1"]
    moved, shares = 0, [0, 0, 0]
    router = driftkv.sharded.Router(abc)  # the cached path the clients use
    for i in range(3000):
        x = driftkv.rendezvous_owner(abc, sid(i))
        assert router.owner(sid(i)) == x
        shares[x] += 1
        assert cab[driftkv.rendezvous_owner(cab, sid(i))] == abc[x]
        y = abcd[driftkv.rendezvous_owner(abcd, sid(i))]
        if y != abc[x]:
            assert y == "d:1", "a sequence moved between old replicas"
            moved += 1
    assert abs(moved - 750) <= 750 * 0.15  # a quarter moves to the new replica
    assert all(abs(s - 1000) <= 150 for s in shares), shares
    with pytest.raises(driftkv.DriftkvError):
        driftkv.ShardedClient(["a:1", "a:1"], clients=[None, None])


def test_shares_within_fifteen_percent(cluster):
    expected = [0, 0, 0]
    for i in range(SEQUENCES):
        expected[cluster.sharded.replica_of(sid(i))] += 1
    stats = cluster.sharded.stats_all()
    assert [s.sequences for s in stats] == expected  # each replica holds exactly what the hash gave it
    for r, n in enumerate(expected):
        print(f"replica {r} ({NAMES[r]}): {n} sequences, share {n / SEQUENCES:.4f}")
        assert abs(n / SEQUENCES - 1 / 3) <= 0.15 / 3, expected
    assert cluster.single.stats().sequences == SEQUENCES


def test_batched_attend_read_length_bit_equal_to_one_server(cluster):
    items = 0
    for batch in cluster.batches(range(SEQUENCES), 7):
        a = cluster.sharded.attend_results(batch)
        b = cluster.single.attend_results(batch)
        assert len(a) == len(batch)
        for it, x, y in zip(batch, a, b):
            assert same_bits(x, y), it.sequence_id
        items += len(batch)
        out, lse = cluster.sharded.attend(batch)  # stacked, the same bits
        assert out.tobytes() == np.stack([y.output for y in b]).tobytes()
        assert lse.tobytes() == np.stack([y.lse for y in b]).tobytes()
    assert items == SEQUENCES
    for i in range(0, SEQUENCES, 3):
        assert cluster.sharded.length(sid(i)) == cluster.single.length(sid(i))
    for i in range(0, SEQUENCES, 70):  # paged ones: page tokens decoded alike
        a, b = cluster.sharded.read(sid(i), 0), cluster.single.read(sid(i), 0)
        assert a.compressed_tokens == b.compressed_tokens == 32
        assert a.keys.tobytes() == b.keys.tobytes() and a.values.tobytes() == b.values.tobytes()
    # Only the owner holds a sequence; unknown ones are NOT_FOUND, named.
    owner = cluster.sharded.replica_of(sid(0))
    for r in range(3):
        if r == owner:
            cluster.sharded.client(r).length(sid(0))
        else:
            with pytest.raises(driftkv.DriftkvError) as e:
                cluster.sharded.client(r).length(sid(0))
            assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(driftkv.DriftkvError) as e:
        cluster.sharded.length("never-stored")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert e.value.replica == NAMES[cluster.sharded.replica_of("never-stored")]
    assert e.value.details.startswith(f"replica {e.value.replica}: ")


def test_decode_steps_in_mixed_batches_bit_equal(cluster):
    some = list(range(1, SEQUENCES, 5))
    for batch in cluster.batches(some, 11):
        for it in batch:
            i = int(it.sequence_id[4:])
            k, v = cluster.kv[i]
            it.new_key, it.new_value, it.new_token_index = k[-1], v[-1], tokens_of(i)
        a = cluster.sharded.attend_each(batch)
        b = cluster.single.attend_results(batch)
        for it, x, y in zip(batch, a, b):
            assert isinstance(x, driftkv.AttendResult), x
            assert same_bits(x, y) and x.tokens == tokens_of(int(it.sequence_id[4:])) + 1, it.sequence_id


def test_asyncio_sharded_client_routes_alike(cluster):
    batch = cluster.batches(range(SEQUENCES), 3)[0]
    expected = cluster.single.attend_results(batch)

    async def main():
        clients = [driftkv.aio.Client(s.target, timeout=20) for s in cluster.servers[:3]]
        async with driftkv.aio.ShardedClient(NAMES, clients=clients) as c:
            assert [c.replica_of(it.sequence_id) for it in batch] == \
                [cluster.sharded.replica_of(it.sequence_id) for it in batch]
            each = await c.attend_each(batch)
            assert all(same_bits(x, y) for x, y in zip(each, expected))
            out, _ = await c.attend(batch)
            assert out.tobytes() == np.stack([y.output for y in expected]).tobytes()
            assert await c.length(sid(10)) == cluster.single.length(sid(10))
            assert [s.sequences for s in await c.stats_all()] == [s.sequences for s in cluster.sharded.stats_all()]

    asyncio.run(main())


def test_removing_a_replica_moves_only_its_sequences(cluster):
    without = [NAMES[0], NAMES[2]]
    moved = 0
    for i in range(SEQUENCES):
        before = NAMES[cluster.sharded.replica_of(sid(i))]
        after = without[driftkv.rendezvous_owner(without, sid(i))]
        if before == NAMES[1]:
            moved += 1
        else:
            assert after == before, f"{sid(i)} moved although its replica stays"
    assert moved == sum(cluster.sharded.replica_of(sid(i)) == 1 for i in range(SEQUENCES)) > 0
    # A client over the remaining two finds every sequence that did not move.
    stayed = [i for i in range(SEQUENCES) if cluster.sharded.replica_of(sid(i)) != 1]
    clients = [driftkv.Client(cluster.servers[r].target, timeout=20) for r in (0, 2)]
    with driftkv.ShardedClient(without, clients=clients) as two:
        for batch in cluster.batches(stayed, 5):
            for x, y in zip(two.attend_results(batch), cluster.single.attend_results(batch)):
                assert same_bits(x, y)


def test_sequence_id_on_is_the_cpp_one():
    """tests/sharded_client_test.cc pins the same ids."""
    r = driftkv.sharded.Router(["a:1", "b:2", "c:3"])
    assert [r.sequence_id_on("user-7", i) for i in range(3)] == ["user-7~1", "user-7", "user-7~4"]
    assert [r.owner(r.sequence_id_on("user-7", i)) for i in range(3)] == [0, 1, 2]


def test_fork_from_prefix_finds_the_replica_that_holds_it(cluster):
    """A prompt stored with its ids on one replica: lookup_all finds it
    there only, fork_from_prefix forks it there under an id that routes
    there (sync and asyncio alike); a prompt nobody holds is NOT_FOUND."""
    ids = [7000 + 13 * i for i in range(320)]  # 9 pages of 32 sealed (the window keeps 32)
    k, v = kv(np.random.default_rng(77), 320, kv_heads=2, head_dim=64)
    cluster.sharded.append("py-prompt", 0, k, v, token_ids=ids)
    holder = cluster.sharded.replica_of("py-prompt")
    found = cluster.sharded.lookup_all(ids)
    assert [a.tokens for a in found] == [288 if r == holder else 0 for r in range(3)]
    asked = ids + list(range(90000, 90040))
    fork = cluster.sharded.fork_from_prefix("py-user", asked)
    assert (fork.replica, fork.result.tokens) == (holder, 288)
    assert fork.sequence_id == cluster.sharded.sequence_id_on("py-user", holder)
    assert cluster.sharded.replica_of(fork.sequence_id) == holder
    mine = cluster.sharded.read(fork.sequence_id, 0, token_count=288)
    src = cluster.sharded.read("py-prompt", 0, token_count=288)
    assert mine.keys.tobytes() == src.keys.tobytes() and mine.values.tobytes() == src.values.tobytes()

    async def main():
        clients = [driftkv.aio.Client(s.target, timeout=20) for s in cluster.servers[:3]]
        async with driftkv.aio.ShardedClient(NAMES, clients=clients) as c:
            assert [a.tokens for a in await c.lookup_all(ids)] == [a.tokens for a in found]
            f = await c.fork_from_prefix("py-user-2", asked)
            assert (f.replica, f.result.tokens) == (holder, 288)
            assert c.replica_of(f.sequence_id) == holder
            await c.release(f.sequence_id)

    asyncio.run(main())
    with pytest.raises(driftkv.DriftkvError) as e:
        cluster.sharded.fork_from_prefix("py-user-3", [5] * 320)
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert f"no replica holds a page of the prompt ({NAMES[0]}: " in e.value.details
    cluster.sharded.release(fork.sequence_id)
    cluster.sharded.release("py-prompt")


# Last (pytest runs a module's tests in order): kills replica 1.
def test_killed_replica_fails_only_its_own_sequences(cluster):
    dead = cluster.servers[1].process
    dead.kill()
    dead.wait()
    failed = ok = 0
    for batch in cluster.batches(range(SEQUENCES), 9):
        a = cluster.sharded.attend_each(batch)
        b = cluster.single.attend_results(batch)
        for it, x, y in zip(batch, a, b):
            if cluster.sharded.replica_of(it.sequence_id) == 1:
                assert isinstance(x, driftkv.DriftkvError), it.sequence_id
                assert x.code == grpc.StatusCode.UNAVAILABLE and x.replica == NAMES[1], x
                assert x.details.startswith(f"replica {NAMES[1]}: ")
                failed += 1
            else:
                assert isinstance(x, driftkv.AttendResult), f"{it.sequence_id}: {x}"
                assert same_bits(x, y), it.sequence_id
                ok += 1
    assert failed > 0 and failed + ok == SEQUENCES
    with pytest.raises(driftkv.DriftkvError) as e:  # the all-or-nothing form raises its error
        cluster.sharded.attend(cluster.batches(range(SEQUENCES), 9)[0])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.replica == NAMES[1]
    # Length, Read, Release, Append: UNAVAILABLE for the dead replica's
    # sequences, working for the others.
    alive = next(i for i in range(SEQUENCES) if cluster.sharded.replica_of(sid(i)) != 1)
    lost = next(i for i in range(SEQUENCES) if cluster.sharded.replica_of(sid(i)) == 1)
    assert cluster.sharded.length(sid(alive)) == cluster.single.length(sid(alive))
    assert cluster.sharded.read(sid(alive), 0).keys.shape == (tokens_of(alive), 2, 64)
    for call in (lambda: cluster.sharded.length(sid(lost)), lambda: cluster.sharded.read(sid(lost), 0),
                 lambda: cluster.sharded.release(sid(lost))):
        with pytest.raises(driftkv.DriftkvError) as e:
            call()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.replica == NAMES[1]
    assert cluster.sharded.release(sid(alive)).tokens_freed == tokens_of(alive)
    # One append_chunks over both: the live replica's chunks are stored, the
    # call raises the dead one's error.
    fresh = [f"fresh-{j}" for j in range(40)]
    k, v = kv(np.random.default_rng(3), 4, kv_heads=2, head_dim=64)
    with pytest.raises(driftkv.DriftkvError) as e:
        cluster.sharded.append_chunks([driftkv.Chunk(s, 0, 0, k, v) for s in fresh])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and e.value.replica == NAMES[1]
    for s in fresh:
        if cluster.sharded.replica_of(s) != 1:
            assert cluster.sharded.length(s)[0].tokens == 4
    stats = cluster.sharded.stats_all()
    assert isinstance(stats[1], driftkv.DriftkvError) and isinstance(stats[0], driftkv.Stats)
    print(f"replica 1 killed: {failed} items failed (UNAVAILABLE, all its own), {ok} answered bit-equal")
