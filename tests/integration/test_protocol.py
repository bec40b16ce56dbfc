"""The wire protocol as the server handles it: request order per
connection, delete and leases, leases bound to their connection, body and
frame limits, the same answers on the same-host socket as over ZeroMQ,
request validation, and an error reply (never silence) to a malformed or
oversize request.

Every request here is sent raw (a pyzmq DEALER, or a raw AF_UNIX socket with
the same-host framing of docs/protocol.md), so what is tested is the server's
own handling, never the C client's checks."""

import errno
import os
import struct

import pytest

from support.data import keys_for

zmq = pytest.importorskip("zmq")
from support.rawproto import (RawLocal, RawZmq, hello_body, keys_body, local_name,  # noqa: E402
                              mp_pack, raw_keys)

E_BADREQ, E_BADOP, E_PROTO, E_TOOBIG = -1002, -1003, -1004, -1005
E_EXPIRED = -1009
MiB = 1 << 20


@pytest.fixture(params=["zmq", "local"])
def raw(request, server):
    """A raw connection to `server` over ZeroMQ or the same-host socket."""
    if request.param == "zmq":
        c = RawZmq(server.url)
    else:
        c = RawLocal(local_name(server))
    yield c
    c.close()


def l1_read_leases(server):
    with server.client() as c:
        return c.status()["l1"]["read_leases"]


# ------------------------------------------------------------------ order


def test_pipelined_requests_take_effect_in_order(raw):
    """store(h, A 200 KB) (copied on a worker), store(h, B 100 B) (copied
    inline), retrieve(h) sent back to back: the first store wins (objects are
    content-addressed) and the replies come in the order sent. Before the
    fix the small store overtook the large one."""
    for i in range(20):
        k = keys_for("order-%d" % i, 1, seed=i)
        a, b = os.urandom(200 << 10), os.urandom(100)
        raw.send([b"s1", b"store", keys_body(k), a])
        raw.send([b"s2", b"store", keys_body(k), b])
        raw.send([b"s3", b"retrieve", keys_body(k)])
        reps = [raw.recv() for _ in range(3)]
        assert [r.rid for r in reps] == [b"s1", b"s2", b"s3"], reps
        assert all(r.status == 0 for r in reps), reps
        assert reps[2].body["n"] == 1 and reps[2].data[0] == a, "a later store overtook"


def test_order_holds_across_slow_and_fast_operations(server):
    """A flush that waits for L2, then a ping: the ping's reply comes second;
    another connection is not held up by the first one's pending flush."""
    z = RawZmq(server.url)
    try:
        k = keys_for("order-flush", 8)
        z.send([b"a", b"store", keys_body(k)] + [os.urandom(256 << 10) for _ in range(8)])
        z.send([b"b", b"flush", b"\x80"])
        z.send([b"c", b"ping", b"\x80"])
        assert [z.recv().rid for _ in range(3)] == [b"a", b"b", b"c"]
    finally:
        z.close()


# ----------------------------------------------------------------- leases


def stored(server, name, n=2, size=1000):
    k = keys_for(name, n)
    pay = [os.urandom(size) for _ in range(n)]
    with server.client() as c:
        assert c.store(k, pay) == n
        c.flush()
    return k, pay


def test_delete_skips_read_locked_keys(server):
    """A key that a lookup read-locked under a lease is skipped by delete (in
    every tier) and named in `skipped`; the lease's retrieve still returns it."""
    k, pay = stored(server, "del-lease", 3)
    owner, other = RawZmq(server.url), RawZmq(server.url)
    try:
        r = owner.call([b"l", b"lookup", keys_body(k[:2])])
        assert r.status == 0 and r.body["hits"] == 2
        lease = r.body["lease"]
        d = other.call([b"d", b"delete", keys_body(k)])
        assert d.status == 0, d
        assert d.body["skipped"] == [0, 1], d
        assert d.body["removed_l1"] == 1 and d.body["removed_l2"] == [1], d
        g = owner.call([b"g", b"retrieve", keys_body(k[:2], lease=lease)])
        assert g.status == 0 and list(g.data) == pay[:2], g
        # the lease ended with the retrieve: now delete removes them
        d = other.call([b"d2", b"delete", keys_body(k)])
        assert d.body["skipped"] == [] and d.body["removed_l1"] == 2, d
        assert d.body["removed_l2"] == [2], d
    finally:
        owner.close()
        other.close()


def test_lease_is_bound_to_its_connection(server):
    """Another connection can neither release nor use a lease (-EPERM, the
    lease is left as it was); a retrieve of other keys is E_BADREQ and does
    not consume it; the owner's retrieve then gets its objects."""
    k, pay = stored(server, "lease-owner", 2)
    other_keys, _ = stored(server, "lease-other", 2)
    a, b = RawZmq(server.url), RawZmq(server.url)
    try:
        r = a.call([b"l", b"lookup", keys_body(k)])
        assert r.status == 0 and r.body["hits"] == 2
        lease = r.body["lease"]
        eperm = -errno.EPERM
        assert b.call([b"f", b"free_locks", mp_pack({"lease": lease})]).status == eperm
        assert b.call([b"g", b"retrieve", keys_body(k, lease=lease)]).status == eperm
        assert b.call([b"p", b"prepare_retrieve", keys_body(k, lease=lease)]).status == eperm
        assert b.call([b"c", b"commit_retrieve", mp_pack({"lease": lease})]).status == eperm
        rel = b.call([b"l2", b"lookup", keys_body(other_keys, release=lease)])
        assert rel.status == eperm and rel.body["error"] == "EPERM", rel
        # the owner, with other keys: refused, lease kept
        w = a.call([b"w", b"retrieve", keys_body(other_keys, lease=lease)])
        assert w.status == E_BADREQ and "other keys" in w.body["message"], w
        assert l1_read_leases(server) == 1
        g = a.call([b"g2", b"retrieve", keys_body(k, lease=lease)])
        assert g.status == 0 and list(g.data) == pay, g
        f = a.call([b"f2", b"free_locks", mp_pack({"lease": lease})])
        assert f.status == 0 and f.body["released"] is False  # ended by the retrieve
        assert l1_read_leases(server) == 0
    finally:
        a.close()
        b.close()


def test_write_lease_is_bound_to_its_connection(server):
    k = keys_for("wlease", 1)
    a, b = RawZmq(server.url), RawZmq(server.url)
    try:
        p = a.call([b"p", b"prepare_store", keys_body(k, sizes=[100])])
        assert p.status == 0 and p.body["offsets"][0] >= 0, p
        lease = p.body["lease"]
        assert b.call([b"c", b"commit_store", mp_pack({"lease": lease})]).status == -errno.EPERM
        c = a.call([b"c2", b"commit_store", mp_pack({"lease": lease})])
        assert c.status == 0 and c.body["accepted"] == 1, c
    finally:
        a.close()
        b.close()


def test_free_locks_gives_a_write_lease_back(server):
    """free_locks takes either kind of lease (docs/protocol.md): on a
    prepare_store's write lease it gives the reservation back with nothing
    published, another connection gets -EPERM and leaves it as it was, and
    the lease is gone afterwards (commit_store: E_EXPIRED)."""
    k = keys_for("wlease-free", 2)
    a, b = RawZmq(server.url), RawZmq(server.url)
    try:
        p = a.call([b"p", b"prepare_store", keys_body(k, sizes=[100, 100])])
        assert p.status == 0 and min(p.body["offsets"]) >= 0, p
        lease = p.body["lease"]
        r = b.call([b"f", b"free_locks", mp_pack({"lease": lease})])
        assert r.status == -errno.EPERM and r.body["error"] == "EPERM", r
        r = a.call([b"f2", b"free_locks", mp_pack({"lease": lease})])
        assert r.status == 0 and r.body["released"] is True, r
        assert a.call([b"l", b"lookup", keys_body(k)]).body["hits"] == 0  # nothing published
        r = a.call([b"c", b"commit_store", mp_pack({"lease": lease})])
        assert r.status == E_EXPIRED, r
        r = a.call([b"f3", b"free_locks", mp_pack({"lease": lease})])
        assert r.status == 0 and r.body["released"] is False, r
        # the keys can be reserved again at once
        p = a.call([b"p2", b"prepare_store", keys_body(k, sizes=[100, 100])])
        assert p.status == 0 and min(p.body["offsets"]) >= 0, p
        c = a.call([b"c2", b"commit_store", mp_pack({"lease": p.body["lease"]})])
        assert c.status == 0 and c.body["accepted"] == 2, c
    finally:
        a.close()
        b.close()


def test_a_reservation_given_up_does_not_take_a_key_another_client_stored(server):
    """Two clients store one key (docs/protocol.md, prepare_store): A
    reserves it, B stores it inline while A's reservation is open; B is not
    told "already there" on the strength of A's reservation. A gives its
    reservation back: B's key is held, with B's bytes. Then the other order
    of publishing: A reserves, B reserves too (a slot of its own), B
    commits first; A's later commit counts the key as accepted and drops
    its copy: readers see B's bytes."""
    k = keys_for("two-writers", 2)
    a, b = RawZmq(server.url), RawZmq(server.url)
    try:
        p = a.call([b"p", b"prepare_store", keys_body(k[:1], sizes=[100])])
        assert p.status == 0 and p.body["offsets"][0] >= 0, p
        r = b.call([b"s", b"store", keys_body(k[:1]), b"B" * 100])
        assert r.status == 0 and r.body == {"accepted": 1, "failed": []}, r
        r = a.call([b"f", b"free_locks", mp_pack({"lease": p.body["lease"]})])
        assert r.status == 0 and r.body["released"] is True, r
        r = b.call([b"r", b"retrieve", keys_body(k[:1])])
        assert r.status == 0 and r.body["n"] == 1 and r.data[0] == b"B" * 100, r
        # both reserve, the second commits first
        pa = a.call([b"p2", b"prepare_store", keys_body(k[1:], sizes=[64])])
        pb = b.call([b"p3", b"prepare_store", keys_body(k[1:], sizes=[64])])
        assert pa.body["offsets"][0] >= 0 and pb.body["offsets"][0] >= 0, (pa, pb)
        assert pa.body["offsets"][0] != pb.body["offsets"][0]
        # (nothing written into the pool here: both publish zeros; the
        # winner is told apart by the status counter)
        before = b.call([b"st", b"status", b""]).body["l1"]["counters"]["stores_raced"]
        cb = b.call([b"c", b"commit_store", mp_pack({"lease": pb.body["lease"]})])
        ca = a.call([b"c2", b"commit_store", mp_pack({"lease": pa.body["lease"]})])
        assert cb.body["accepted"] == 1 and ca.body["accepted"] == 1, (cb, ca)
        after = b.call([b"st2", b"status", b""]).body["l1"]["counters"]["stores_raced"]
        assert after == before + 1
        assert a.call([b"l", b"lookup", keys_body(k[1:])]).body["hits"] == 1
    finally:
        a.close()
        b.close()


def test_documented_edges_of_keys_and_leases(server):
    """What docs/protocol.md says of the edges a client written from it
    meets: key fields that default, 32-bit kv_rank/group/shape, lease 0 when
    nothing was locked, and the written bitmap (bit j = j-th reserved slot,
    least significant bit first)."""
    c = RawZmq(server.url)
    try:
        h = [bytes([i]) * 32 for i in range(11)]
        # model and hashes only: kv_rank 0, group 0, salt "" (nil the same)
        r = c.call([b"s", b"store", raw_keys("edges", h[:1]), b"x" * 64])
        assert r.status == 0 and r.body["accepted"] == 1, r
        full = mp_pack({"keys": {"model": "edges", "kv_rank": 0, "group": 0, "salt": None,
                                 "hashes": h[:1]}})
        assert c.call([b"l", b"lookup", full]).body["hits"] == 1
        for bad in ({"kv_rank": 2 ** 32}, {"group": 2 ** 32}):
            k = {"model": "edges", "hashes": h[:1]}
            k.update(bad)
            r = c.call([b"b", b"lookup", mp_pack({"keys": k})])
            assert r.status == E_BADREQ and "32 bits" in r.body["message"], r
        r = c.call([b"sh", b"store", raw_keys("edges", h[9:10], shape=[2 ** 32]), b"y"])
        assert r.status == E_BADREQ and "2^32-1" in r.body["message"], r
        r = c.call([b"sh2", b"store", raw_keys("edges", h[9:10], shape=[2 ** 32 - 1]), b"y"])
        assert r.status == 0, r
        # nothing locked: lease 0, which names no lease
        miss = raw_keys("edges-miss", h[:2])
        r = c.call([b"m", b"lookup", miss])
        assert r.status == 0 and r.body == {"hits": 0, "lease": 0}, r
        assert c.call([b"m2", b"prepare_retrieve", miss]).body["lease"] == 0
        r = c.call([b"f", b"free_locks", mp_pack({"lease": 0})])
        assert r.status == 0 and r.body["released"] is False, r
        # 9 reserved slots behind one present key: bits 0 and 8 = slots 0 and 8
        ks = raw_keys("edges", h[:9] + h[10:], sizes=[16] * 10)
        p = c.call([b"p", b"prepare_store", ks])
        offs = p.body["offsets"]
        assert p.status == 0 and offs[0] == -1 and min(offs[1:]) >= 0, p
        r = c.call([b"w0", b"commit_store", mp_pack({"lease": p.body["lease"], "written": b"\x01"})])
        assert r.status == E_BADREQ, r  # 9 slots need 2 bytes
        r = c.call([b"w", b"commit_store", mp_pack({"lease": p.body["lease"],
                                                     "written": b"\x01\x01\x00"})])
        assert r.status == 0 and r.body["accepted"] == 2, r
        got = [c.call([b"g%d" % i, b"lookup", raw_keys("edges", [h[i]])]).body["hits"]
               for i in range(11)]
        # h[0] stored first, h[1] slot 0, h[9] stored with the shape, h[10] slot 8
        assert got == [1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1], got
    finally:
        c.close()


def test_lease_ids_are_not_guessable(server):
    """Ids were gen << 32 | slot: consecutive leases differed by 2^32 + 1."""
    k, _ = stored(server, "lease-ids", 1)
    z = RawZmq(server.url)
    try:
        ids = []
        for i in range(8):
            r = z.call([b"l%d" % i, b"lookup", keys_body(k, release=ids[-1] if ids else 0)])
            assert r.status == 0 and r.body["hits"] == 1
            ids.append(r.body["lease"])
        diffs = {(y - x) % (1 << 64) for x, y in zip(ids, ids[1:])}
        assert len(set(ids)) == 8 and len(diffs) == 7, ids
        assert not diffs & {1 << 32, (1 << 32) + 1}, ids
    finally:
        z.close()


# ----------------------------------------------------------------- limits


def test_max_batch_gets_a_reply_with_a_small_object_limit(make_server):
    """65,536 hashes of 32 bytes make a 2.2 MB body: with --max-object-mb 1
    ZeroMQ used to drop it (frame limit = object limit + 1 MiB) without a
    reply. One more hash is E_BADREQ, on both paths."""
    s = make_server(["--max-object-mb", "1"])
    hashes = [struct.pack(">Q", i) * 4 for i in range(65536)]
    conns = [RawZmq(s.url), RawLocal(local_name(s))]
    try:
        for c in conns:
            r = c.call([b"m", b"lookup", raw_keys("maxbatch", hashes)])
            assert r.status == 0 and r.body["hits"] == 0, r
            r = c.call([b"m1", b"lookup", raw_keys("maxbatch", hashes + [b"\x01" * 32])])
            assert r.status == E_BADREQ and "too many keys" in r.body["message"], r
    finally:
        for c in conns:
            c.close()


def test_frame_count_limit_is_the_same_on_both_paths(raw):
    """65,544 frames are read as a request (here: a store whose data frames do
    not match its keys); 65,545 get E_BADREQ "too many frames". The same-host
    socket used to close the connection instead of answering."""
    k = keys_for("frames", 1)
    head = [b"f", b"store", keys_body(k)]
    r = raw.call(head + [b"x"] * (65544 - 3))
    assert r.status == E_BADREQ and "data frames" in r.body["message"], r
    r = raw.call(head + [b"x"] * (65545 - 3))
    assert r.status == E_BADREQ and "too many frames" in r.body["message"], r
    r = raw.call([b"g", b"ping", b"\x80"])
    assert r.rid == b"g" and r.status == 0


def test_local_socket_answers_a_message_of_no_frames(server):
    loc = RawLocal(local_name(server))
    try:
        r = loc.call([])
        assert r.rid == b"" and r.status == E_BADREQ, r
        r = loc.call([b"x"] * 70000)
        assert r.status == E_BADREQ and "too many frames" in r.body["message"], r
        assert loc.call([b"p", b"ping", b"\x80"]).status == 0
    finally:
        loc.close()


def test_oversize_payload_reaches_the_servers_check(make_server):
    """The server's own E_TOOBIG (the C client refuses first, so only a raw
    request reaches it), on both paths; the connection keeps working."""
    s = make_server(["--max-object-mb", "1"])
    k = keys_for("big", 1)
    for c in (RawZmq(s.url), RawLocal(local_name(s))):
        try:
            r = c.call([b"b", b"store", keys_body(k), b"x" * (MiB + 1)])
            assert r.status == E_TOOBIG and "at most 1048576" in r.body["message"], r
            r = c.call([b"s", b"prepare_store", keys_body(k, sizes=[MiB + 1])])
            assert r.status == E_TOOBIG, r
            assert c.call([b"p", b"ping", b"\x80"]).status == 0
        finally:
            c.close()


# ------------------------------------------------------------- validation


def test_request_validation(raw):
    def call(frames):
        return raw.call(frames)

    r = call([b"v", b"hello", mp_pack({"version": -1})])
    assert r.status == E_PROTO, r
    r = call([b"v", b"hello", mp_pack({"version": 2})])
    assert r.status == E_PROTO, r
    r = call([b"v", b"hello", mp_pack({})])
    assert r.status == E_BADREQ and "version" in r.body["message"], r
    r = call([b"v", b"hello", mp_pack({"version": "1"})])
    assert r.status == E_BADREQ, r
    r = call([b"v", b"hello", hello_body()])
    assert r.status == 0 and r.body["version"] == 1
    # fewer than three frames
    r = call([b"two", b"ping"])
    assert r.rid == b"two" and r.status == E_BADREQ, r
    r = call([b"one"])
    assert r.status == E_BADREQ, r
    # release and hashes of the wrong type
    k = keys_for("valid", 1)
    r = call([b"r", b"lookup", keys_body(k, release="x")])
    assert r.status == E_BADREQ, r
    r = call([b"h", b"lookup", mp_pack({"keys": {"model": "m", "hashes": ["abc"]}})])
    assert r.status == E_BADREQ and "bin" in r.body["message"], r
    # request ids: empty is refused; a long one is echoed whole
    r = call([b"", b"ping", b"\x80"])
    assert r.rid == b"" and r.status == E_BADREQ, r
    long_id = bytes(range(33))
    r = call([long_id, b"ping", b"\x80"])
    assert r.rid == long_id and r.status == E_BADREQ and "1..32" in r.body["message"], r
    r = call([b"x" * 32, b"ping", b"\x80"])
    assert r.rid == b"x" * 32 and r.status == 0
    # an op name that is not UTF-8: the message is (mp_unpack decodes strictly)
    r = call([b"u", b"\xff\xfeop\xc3", b"\x80"])
    assert r.status == E_BADOP and "\\xff\\xfeop\\xc3" in r.body["message"], r
    r = call([b"u2", "nö_op".encode(), b"\x80"])
    assert r.status == E_BADOP and "nö_op" in r.body["message"], r
    assert call([b"ok", b"ping", b"\x80"]).status == 0


def test_bad_requests_get_error_replies(server):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(server.url)

    def call(frames):
        sock.send_multipart(frames)
        rep = sock.recv_multipart()
        st = int.from_bytes(rep[1], "little", signed=True)
        return rep[0], st, rep[2]

    rid, st, body = call([b"r1", b"no_such_op", b"\x80"])
    assert rid == b"r1" and st != 0 and b"E_BADOP" in body
    rid, st, body = call([b"r2", b"lookup", b"\x81\xa4ke"])  # truncated msgpack
    assert rid == b"r2" and st != 0 and b"E_BADREQ" in body
    rid, st, body = call([b"r3", b"lookup", b"\x93\x01\x02\x03"])  # not a map
    assert st != 0 and b"map" in body

    def keys_body(model):
        import struct
        m = model.encode()
        # {"keys": {"model": m, "hashes": [bin32]}}
        return (b"\x81\xa4keys\x82\xa5model" + bytes([0xd9, len(m)]) + m +
                b"\xa6hashes\x91\xc4\x20" + b"\x01" * 32)

    rid, st, body = call([b"r4", b"lookup", keys_body("/models/../../etc")])
    assert st != 0 and b"E_BADKEY" in body
    rid, st, body = call([b"r5", b"lookup", keys_body("a@b")])
    assert st != 0 and b"E_BADKEY" in body
    rid, st, body = call([b"r6", b"store", keys_body("fine")])  # 1 key, 0 frames
    assert st != 0 and b"data frames" in body
    rid, st, body = call([b"r7"])  # no op frame
    assert st != 0
    rid, st, body = call([b"r8", b"lookup", keys_body("fine")])
    assert st == 0
    sock.close(0)
    ctx.term()
    with server.client() as c:  # still serving
        c.ping()
        st = c.status()
        assert st["rpc"]["bad_requests"] >= 6


def test_oversize_payload_is_refused(make_server):
    """The server's own E_TOOBIG: the C client refuses an oversize payload
    before sending it, so the request goes raw over a DEALER."""
    s = make_server(["--max-object-mb", "1"])
    z = RawZmq(s.url)
    try:
        r = z.call([b"big", b"store", keys_body(keys_for("big", 1)), b"x" * (2 * MiB)])
        assert r.rid == b"big" and r.status == -1005 and r.body["error"] == "E_TOOBIG", r
        assert z.call([b"p", b"ping", b"\x80"]).status == 0
    finally:
        z.close()
    with s.client(shm=False) as c:
        c.ping()
        assert c.status()["rpc"]["bad_requests"] >= 1
