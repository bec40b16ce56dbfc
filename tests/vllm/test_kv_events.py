"""KV events from every tier (docs/events.md), read by a subscriber built on
the pinned vLLM's own event classes (support.kvevents): every batch must
decode as vLLM decodes it. A real kvtier server, the real client library;
no engine is needed for these tests."""

import json
import os
import struct
import time

import pytest

from support.data import adapter_json, keys_for, random_payloads
from support.engine import Engine, kvtier_connector_config
from support.kvevents import Subscriber
from support.ports import free_port
from support.prompts import BLOCK, CHUNK, MAX_TOKENS, prompt, tokens
from support.server import SANITIZER_MARKERS, Server, metric, run_kvtier, wait_for
from vllm.distributed.kv_events import AllBlocksCleared, BlockStored

L1 = "CPU"
FS = "STORAGE:fs[0]"
MiB = 1 << 20


def events_server(tmp_path, extra=(), data="data"):
    pub, rep = free_port(), free_port()
    s = Server(["--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep] + list(extra),
               tmp_path, data_dir=str(tmp_path / data))
    s.pub = "tcp://127.0.0.1:%d" % pub
    s.rep = "tcp://127.0.0.1:%d" % rep
    return s


@pytest.fixture
def started(tmp_path):
    made = []

    def make(extra=()):
        s = events_server(tmp_path, extra)
        made.append(s)
        s.start()
        s.wait_recovered()
        return s

    yield make
    for s in made:
        s.kill()
    for s in made:  # under make test-asan / test-tsan: any report fails the test
        log = s.read_log()
        assert not any(m in log for m in SANITIZER_MARKERS), log[-6000:]


def hashes(keys):
    return set(keys.hashes)


def store(s, keys, size=4096):
    with s.client() as c:
        assert c.store(keys, random_payloads(len(keys), size)) == len(keys)
        assert not c.flush()  # every L2 store done


def test_store_announced_in_l1_and_l2(started):
    """A store: AllBlocksCleared first (sequence 0), then every chunk as
    BlockStored in L1 ("CPU") and in the fs adapter; vLLM's decoder reads
    every batch and the sequence has no gap."""
    s = started()
    with Subscriber(s.pub, s.rep) as sub:
        keys = keys_for("m", 8)
        store(s, keys)
        sub.replay(0)
        sub.wait(lambda x: x.view().get(FS) == hashes(keys))
        assert sub.view() == {L1: hashes(keys), FS: hashes(keys)}
        seqs = sorted(sub.batches)
        assert seqs == list(range(len(seqs)))
        first = sub.batches[0].events
        assert len(first) == 1 and isinstance(first[0], AllBlocksCleared)
        for _, e in sub.events():
            if isinstance(e, BlockStored):
                assert e.parent_block_hash is None and e.token_ids == []
                assert e.block_size == 256 and e.lora_id is None and e.lora_name is None
        assert sub.batches[seqs[-1]].data_parallel_rank == 0
        st = s.http_get("/status")
        ev = json.loads(st[1])["kv_events"]
        assert ev["media"] == [L1, FS] and ev["blocks_stored"] == 16 and ev["dropped"] == 0


def test_l1_eviction_removes_from_l1_only(started):
    """Objects evicted from L1 are BlockRemoved for "CPU" while the fs
    adapter keeps announcing them: the subscriber's view of each tier is
    what the tier holds."""
    s = started(["--l1-size-gb", "0.03", "--l1-init-size-gb", "0.03"])
    with Subscriber(s.pub, s.rep) as sub:
        keys = keys_for("ev", 48)
        for i in range(0, 48, 8):
            store(s, keys[i:i + 8], size=MiB)
        sub.replay(0)
        sub.wait(lambda x: x.view().get(FS) == hashes(keys), what="every key in fs")
        evicted = sub.removed(L1)
        assert evicted and evicted < hashes(keys)
        assert not sub.removed(FS)
        with s.client() as c:
            l1_objects = c.status()["l1"]["objects"]
        assert len(sub.view()[L1]) == l1_objects
        assert sub.view()[L1] == hashes(keys) - evicted


def test_delete_and_purge_remove_from_every_tier(started, tmp_path):
    """delete: BlockRemoved in L1 and fs for the deleted keys; kvtier purge
    --all: BlockRemoved in fs for every object, and in L1 for its copies."""
    s = started()
    with Subscriber(s.pub, s.rep) as sub:
        keys = keys_for("pg", 10)
        store(s, keys)
        with s.client() as c:
            c.delete(keys[:2])
        sub.replay(0)
        sub.wait(lambda x: x.removed(FS) == hashes(keys[:2]))
        assert sub.removed(L1) == hashes(keys[:2])
        r = run_kvtier("purge", "--all", "--yes", "--root", str(tmp_path / "data"), "--url", s.url)
        assert r.returncode == 0, r.stderr + r.stdout
        sub.wait(lambda x: not x.view(), what="nothing held")
        assert sub.removed(FS) == hashes(keys) and sub.removed(L1) == hashes(keys)


def test_restart_announces_what_recovery_found(tmp_path):
    """A stop sends AllBlocksCleared last; after a restart the new server
    starts with AllBlocksCleared and announces what the fs scan recovered,
    and only in the fs medium (L1 starts empty)."""
    s = events_server(tmp_path)
    s.start()
    try:
        keys = keys_for("rs", 6)
        with Subscriber(s.pub, s.rep) as sub:
            store(s, keys)
            sub.replay(0)
            sub.wait(lambda x: x.view().get(FS) == hashes(keys))
            s.stop()  # SIGTERM: a clean stop
            sub.wait(lambda x: not x.view(), what="AllBlocksCleared at stop")
            last = sub.batches[max(sub.batches)].events
            assert isinstance(last[-1], AllBlocksCleared)
        s.start()
        s.wait_recovered()
        with Subscriber(s.pub, s.rep) as sub:
            sub.replay(0)
            sub.wait(lambda x: x.view().get(FS) == hashes(keys), what="recovered keys")
            assert sub.view() == {FS: hashes(keys)}
            assert isinstance(sub.batches[0].events[0], AllBlocksCleared)
    finally:
        s.kill()


def test_replay_serves_what_the_buffer_holds(started):
    """A subscriber that connects late gets every batch from the replay
    socket; with a buffer of 3 batches only the last 3 come back, the first
    above the sequence asked for."""
    # (published at once: the first batch waits for no subscriber)
    s = started(["--kv-events-buffer", "3", "--kv-events-wait-subscriber-ms", "0"])
    keys = keys_for("rp", 5)
    for k in keys:  # one store each: batches of their own
        store(s, k)
    with Subscriber(s.pub, s.rep) as sub:
        wait_for(lambda: json.loads(s.http_get("/status")[1])["kv_events"]["blocks_stored"] == 10)
        n = json.loads(s.http_get("/status")[1])["kv_events"]["batches"]
        assert n > 3
        got = sub.replay(0)
        assert got == [n - 3, n - 2, n - 1]
        assert sub.replay(n) == []
        assert json.loads(s.http_get("/status")[1])["kv_events"]["replay_requests"] == 2


def test_drops_are_counted_and_leave_a_gap(started):
    """A queue of one event and a store of 64 chunks at once: events are
    dropped and counted in /status and /metrics, the store is unaffected,
    and the subscriber sees a sequence number skipped. A second subscriber
    that never reads slows nothing."""
    s = started(["--kv-events-queue", "1", "--kv-events-hwm", "1"])
    with Subscriber(s.pub, s.rep) as sub, Subscriber(s.pub, rcvhwm=1) as idle:
        time.sleep(0.3)  # both subscriptions reach the server
        keys = keys_for("dr", 64)
        t0 = time.time()
        store(s, keys)
        assert time.time() - t0 < 10
        # the gap is counted when the batch after the drops goes out: the
        # publisher thread sends the last queued event a little later
        def gap_sent():
            ev = json.loads(s.http_get("/status")[1])["kv_events"]
            return ev if ev["gaps"] > 0 else None

        ev = wait_for(gap_sent, what="the gap sent")
        assert ev["dropped"] > 0
        metrics = s.http_get("/metrics")[1]
        assert "kvtier_kv_events_dropped_total %d" % ev["dropped"] in metrics
        sub.replay(0)
        seqs = sorted(sub.batches)
        assert seqs[-1] + 1 > len(seqs)  # a sequence number no batch has
        idle.sub.close(linger=0)


def test_engine_block_hashes_name_the_chunks(started):
    """A store with the engine's block hashes ("blocks"): every tier
    announces the chunks by them, as one chain per store (parent, block
    size, token ids as given), and removals name the same hashes; vLLM's
    integer hashes stay integers."""
    s = started()
    keys = keys_for("eb", 3)
    eng = [bytes([k, b]) * 16 for k in range(3) for b in range(4)]  # 4 blocks per chunk
    parent = b"\x07" * 32
    toks = list(range(3 * 64))
    with Subscriber(s.pub, s.rep) as sub:
        with s.client() as c:
            with c.store_view(keys[:2], [4096] * 2, blocks={"size": 16, "hashes": eng[:8],
                                                             "parent": parent,
                                                             "tokens": toks[:128]}) as views:
                for v in views:
                    v[:] = b"\x01" * 4096
            assert c.store(keys[2:], [b"x" * 100], blocks={"size": 16, "hashes": eng[8:],
                                                          "parent": eng[7],
                                                          "tokens": toks[128:]}) == 1
            assert not c.flush()
        sub.replay(0)
        sub.wait(lambda x: x.view().get(FS) == set(eng), what="engine hashes in fs")
        assert sub.view() == {L1: set(eng), FS: set(eng)}
        # in store order; consecutive chains may share one event (the third
        # chunk's parent is the second's last block)
        stored = [e for _, e in sub.events() if isinstance(e, BlockStored) and e.medium == L1]
        assert [h for e in stored for h in e.block_hashes] == eng
        assert [t for e in stored for t in e.token_ids] == toks
        assert stored[0].parent_block_hash == parent
        assert all(e.block_size == 16 for e in stored)
        with s.client() as c:
            c.delete(keys)
        sub.wait(lambda x: not x.view(), what="removals")
        assert sub.removed(L1) == set(eng) and sub.removed(FS) == set(eng)
        st = json.loads(s.http_get("/status")[1])["kv_events"]
        assert st["tagged"] == 0 and st["orphans"] == 0
        # integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
        k2 = keys_for("ei", 1)
        with s.client() as c:
            assert c.store(k2, [b"y" * 10], blocks={"size": 32, "hashes": [1, 2**64 - 1]}) == 1
        sub.wait(lambda x: x.view().get(L1) == {1, 2**64 - 1}, what="integer hashes")


def test_store_sent_in_parts_keeps_one_chain(started):
    """A store larger than one part (the client sends about 32 MiB per
    request, so that L2 writes overlap the copy of the next part;
    docs/performance.md): 20 chunks of 4 MiB go as three requests, and
    each part's first chunk gets the block before it (the previous part's
    last) as parent, so the chain, the tokens and every byte are those of
    one store."""
    s = started(["--l1-size-gb", "0.25"])
    n, per = 20, 2
    keys = keys_for("parts", n)
    eng = [bytes([k, b]) * 16 for k in range(n) for b in range(per)]
    ints = [(k << 8) | b for k in range(n) for b in range(per)]
    parent = b"\x05" * 32
    toks = list(range(n * 2 * 16))
    pays = random_payloads(n, 4 * MiB)

    def prepares():
        return metric(s, "kvtier_rpc_requests_total", op="prepare_store") or 0

    with Subscriber(s.pub, s.rep) as sub:
        before = prepares()
        with s.client() as c:
            assert c.store(keys, pays, blocks={"size": 16, "hashes": eng, "parent": parent,
                                               "tokens": toks}) == n
            assert not c.flush()
            assert c.retrieve(keys) == pays
        assert prepares() - before == 3  # 8 + 8 + 4 chunks of 4 MiB: three parts
        sub.replay(0)
        sub.wait(lambda x: x.view().get(FS) == set(eng), what="every chunk in fs")
        stored = [e for _, e in sub.events() if isinstance(e, BlockStored) and e.medium == L1]
        assert [h for e in stored for h in e.block_hashes] == eng
        assert [t for e in stored for t in e.token_ids] == toks
        # every event's parent is the block before its first, whatever part it came in
        at = 0
        for e in stored:
            assert e.parent_block_hash == (parent if at == 0 else eng[at - 1])
            at += len(e.block_hashes)
        # integer hashes, no parent, no tokens: the later parts' parents are ints
        k2 = keys_for("parts-int", n)
        with s.client() as c:
            assert c.store(k2, pays, blocks={"size": 16, "hashes": ints}) == n
            assert not c.flush()
        sub.wait(lambda x: set(ints) <= x.view().get(FS, set()), what="integer chain in fs")
        st2 = [e for _, e in sub.events() if isinstance(e, BlockStored) and e.medium == L1
               and e.block_hashes[0] in set(ints)]
        at = 0
        for e in st2:
            assert e.parent_block_hash == (None if at == 0 else ints[at - 1])
            at += len(e.block_hashes)
        assert at == len(ints)


def tagged_server(tmp_path, kind):
    """An events server on one persistent adapter of kind (fs: --data-dir)
    and its medium."""
    if kind == "fs":
        return events_server(tmp_path), FS
    if kind in ("fs_native", "fs_odirect"):
        a = adapter_json(type="fs_native" if kind == "fs_native" else "fs",
                         base_path=str(tmp_path / "data"), max_capacity_gb=1,
                         use_odirect=kind == "fs_odirect")
    elif kind == "raw_block":
        img = tmp_path / "rb.img"
        with open(img, "wb") as f:
            f.truncate(48 << 20)
        a = adapter_json(type="raw_block", device_path=str(img), slot_bytes=256 * 1024,
                         meta_total_bytes=1 << 20, use_odirect=False)
    else:
        a = adapter_json(type="dax", device_path=str(tmp_path / "dax.img"),
                         max_dax_size_gb=0.02, slot_bytes=256 * 1024)
    pub, rep = free_port(), free_port()
    s = Server(["--kv-events-endpoint", "tcp://127.0.0.1:%d" % pub,
                "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % rep,
                "--l2-adapter", a], tmp_path)
    s.pub, s.rep = "tcp://127.0.0.1:%d" % pub, "tcp://127.0.0.1:%d" % rep
    return s, "STORAGE:%s[0]" % kind.replace("_odirect", "")


def header_lengths(d):
    """(version, hdr_len, payload bytes) of each object file under d."""
    out = []
    for name in os.listdir(d):
        if name.endswith(".data"):
            with open(os.path.join(d, name), "rb") as f:
                h = f.read(24)
            size = os.path.getsize(os.path.join(d, name))
            ver, hl = struct.unpack_from("<HH", h, 8)
            out.append((ver, hl, size - hl))
    return sorted(out)


@pytest.mark.parametrize("kind", ["fs", "fs_native", "fs_odirect", "raw_block", "dax"])
def test_restart_names_chunks_by_their_engine_hashes(tmp_path, kind):
    """The engine's block hashes are written with each object: after a
    restart the scan's BlockStored name the chunks by them (parent and
    block size as stored; token ids too where the header grows to hold
    them: fs and fs_native; raw_block's and dax's 512-byte headers keep the
    hashes only), a chunk stored without them by its key hash, integer
    hashes stay integers, and a removal after the restart (purge --all of
    the fs root, delete elsewhere) names the same hashes."""
    s, medium = tagged_server(tmp_path, kind)
    s.start()
    try:
        s.wait_recovered()
        keys = keys_for("rt", 3)
        eng = [bytes([k, b]) * 16 for k in range(3) for b in range(4)]
        parent = b"\x09" * 32
        toks = list(range(1000, 1000 + 3 * 64))
        plain = keys_for("rp", 2)
        ints = keys_for("ri", 1)
        with Subscriber(s.pub, s.rep) as sub:
            with s.client() as c:
                assert c.store(keys, [b"\x02" * 4096] * 3,
                               blocks={"size": 16, "hashes": eng, "parent": parent,
                                       "tokens": toks}) == 3
                assert c.store(plain, [b"\x03" * 4096] * 2) == 2
                assert c.store(ints, [b"\x04" * 100],
                               blocks={"size": 32, "hashes": [5, 2**64 - 2]}) == 1
                assert not c.flush()
            want = set(eng) | hashes(plain) | {5, 2**64 - 2}
            sub.replay(0)
            sub.wait(lambda x: x.view().get(medium) == want, what="stored in " + medium)
            if kind.startswith("fs"):
                st = json.loads(s.http_get("/status")[1])
                blk = st["l2"][0].get("block_size", 512) if kind == "fs_odirect" else 512
                if kind == "fs_odirect":
                    assert st["l2"][0]["odirect"] == "on", st["l2"][0]
                # the tagged chunks' headers grew (tokens included), to a
                # multiple of the O_DIRECT block under O_DIRECT; the others
                # are version 1, as before
                got = header_lengths(tmp_path / "data")
                assert got == sorted([(2, 1024 if blk == 512 else blk, 4096)] * 3 +
                                     [(2, 512, 100)] + [(1, blk, 4096)] * 2), got
        s.stop()
        s.start()
        s.wait_recovered()
        with Subscriber(s.pub, s.rep) as sub:
            sub.replay(0)
            sub.wait(lambda x: x.view().get(medium) == want, what="recovered by engine hashes")
            assert sub.view() == {medium: want}
            assert isinstance(sub.batches[0].events[0], AllBlocksCleared)
            by_hash = {}
            for _, e in sub.events():
                if isinstance(e, BlockStored):
                    assert e.medium == medium
                    for i, h in enumerate(e.block_hashes):
                        by_hash[h] = (e, i)
            # each chunk's blocks: the parent before its first, its tokens
            grows = kind.startswith("fs")
            for k in range(3):
                e, i = by_hash[eng[4 * k]]
                assert e.block_size == 16
                assert e.block_hashes[i:i + 4] == eng[4 * k:4 * k + 4]
                if i == 0:
                    assert e.parent_block_hash == (parent if k == 0 else eng[4 * k - 1])
                    assert e.token_ids[:64] == (toks[64 * k:64 * k + 64] if grows else [])
            for h in hashes(plain):
                e, _ = by_hash[h]
                assert e.parent_block_hash is None and e.token_ids == [] and e.block_size == 256
            e, i = by_hash[5]
            assert e.block_size == 32 and e.block_hashes[i:i + 2] == [5, 2**64 - 2]
            st = json.loads(s.http_get("/status")[1])["kv_events"]
            assert st["tagged"] == 4 and st["orphans"] == 0
            # the bytes are what was stored (the headers with a tag read back)
            with s.client() as c:
                assert c.lookup(plain) == 2 and c.lookup(ints) == 1 and c.lookup(keys) == 3
                got = c.retrieve(keys)
                assert [bytes(g) for g in got] == [b"\x02" * 4096] * 3
                if not kind.startswith("fs"):
                    for ks in (keys, plain, ints):
                        c.delete(ks)
            if kind.startswith("fs"):
                r = run_kvtier("purge", "--all", "--yes", "--root", str(tmp_path / "data"),
                               "--url", s.url)
                assert r.returncode == 0, r.stderr + r.stdout
            sub.wait(lambda x: not x.view().get(medium), what="removed")
            assert sub.removed(medium) == want
    finally:
        s.kill()
    log = s.read_log()
    assert not any(m in log for m in SANITIZER_MARKERS), log[-6000:]


def test_blocks_field_refused_when_malformed(started):
    """A malformed "blocks" is E_BADREQ and stores nothing."""
    import kvtier
    s = started()
    keys = keys_for("bad", 2)
    with s.client() as c:
        for b in [{"size": 16, "hashes": [b"a" * 32] * 3},       # not the same count per key
                  {"size": 16, "hashes": [b"a" * 32, b"b" * 31]},  # two lengths
                  {"size": 16, "hashes": [b"a" * 33] * 2},         # longer than 32 bytes
                  {"size": 0, "hashes": [b"a" * 32] * 2}]:         # no block size
            with pytest.raises((kvtier.KvtierError, ValueError)):
                c.store(keys, [b"x"] * 2, blocks=b)
        assert c.lookup(keys) == 0


# ------------------------------------------------ with a real vLLM engine

P_EVENTS = prompt("events", tokens(300, 40))  # 4 full chunks of 64 + 44: 9 full blocks of 32


def test_engine_hashes_match_vllms_own_events(tiny_model, baseline, tmp_path):
    """A real vLLM engine with kvtier's connector and its own KV events on:
    kvtier announces exactly the prompt's full chunks' blocks (8 of vLLM's 9
    full blocks: 4 chunks of 2), in L1 and in the fs adapter, under the very
    block hashes vLLM publishes for them, as one chain with vLLM's block
    size, parent and tokens; the output is the no-connector run's."""
    s = events_server(tmp_path, ["--chunk-size", str(CHUNK), "--l2-prefetch-policy", "retain"])
    s.start()
    vport = free_port()
    try:
        # vLLM binds an endpoint with '*' (and connects to any other)
        with Subscriber(s.pub, s.rep) as kv, Subscriber("tcp://127.0.0.1:%d" % vport) as vl:
            cfg = kvtier_connector_config(s.url, retry_s=1, timeout_ms=3000)
            ev_cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://*:%d" % vport, "topic": "vllm"}
            with Engine(tiny_model, cfg, kv_events_config=ev_cfg,
                        log=str(tmp_path / "engine.log")) as eng:
                r = eng.generate([{"tokens": P_EVENTS}], max_tokens=MAX_TOKENS)
                assert r["outputs"][0]["tokens"] == baseline["events"]
                nfull = len(P_EVENTS) // CHUNK * (CHUNK // BLOCK)
                vl.wait(lambda x: len(x.view().get("GPU", ())) >= len(P_EVENTS) // BLOCK,
                        timeout=60, what="vLLM's own events")
                kv.replay(0)
                kv.wait(lambda x: len(x.view().get(FS, ())) >= nfull, timeout=60,
                        what="kvtier's events in fs")
            vstored = [e for _, e in vl.events() if isinstance(e, BlockStored)]
            vhashes = [h for e in vstored for h in e.block_hashes]
            assert len(vhashes) >= nfull
            want = vhashes[:nfull]
            for medium in (L1, FS):
                ours = [e for _, e in kv.events() if isinstance(e, BlockStored) and e.medium == medium]
                assert sorted(h for e in ours for h in e.block_hashes) == sorted(want), medium
                # each event is a piece of vLLM's chain: its blocks in order, the
                # block before them as parent, their tokens (fs writes finish in
                # any order: its pieces may come in any order)
                for e in ours:
                    i = want.index(e.block_hashes[0])
                    assert e.block_hashes == want[i:i + len(e.block_hashes)]
                    assert e.parent_block_hash == (want[i - 1] if i else None)
                    assert e.token_ids == P_EVENTS[i * BLOCK:(i + len(e.block_hashes)) * BLOCK]
                    assert e.block_size == BLOCK
            l1 = [e for _, e in kv.events() if isinstance(e, BlockStored) and e.medium == L1]
            assert [h for e in l1 for h in e.block_hashes] == want  # one store: in order
            assert set(kv.view()) == {L1, FS}
    finally:
        s.kill()
