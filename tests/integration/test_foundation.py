"""Foundation: one path from a client to the fs tier, restart, corruption,
tmp files, capacity cap and bad input, against the real binary."""

import json
import os
import signal
import time

import pytest

import kvtier
from support.data import adapter_json, du_bytes, fs_files, keys_for, random_payloads
from support.faultio import FAULTIO, needs_faultio
from support.server import run_kvtier

MiB = 1 << 20


def test_round_trip_survives_sigkill(server, tmp_path):
    """64 x 1 MiB stored, flushed, server SIGKILLed and restarted: lookup 64,
    identical bytes, and status shows the restored bytes before any lookup."""
    keys = kvtier.chunk_keys("my-model", list(range(64 * 256)), chunk_size=256)
    pay = random_payloads(64, MiB, seed=1)
    with server.client() as c:
        assert c.store(keys, pay) == 64
        c.flush()
        before = c.status()["l2"][0]
    assert before["objects"] == 64
    server.kill(signal.SIGKILL)
    server.start()
    st = server.wait_recovered()
    a = st["l2"][0]
    assert a["recovery"]["objects"] == 64
    assert a["used_bytes"] == before["used_bytes"] == du_bytes(tmp_path / "data")
    assert a["counters"]["lookups"] == 0  # restored before any lookup touched them
    with server.client() as c:
        assert c.lookup(keys) == 64
        assert c.retrieve(keys) == pay


@pytest.mark.parametrize("shm", [True, False])
def test_store_retrieve_paths(server, shm):
    keys = keys_for("paths", 8)
    pay = random_payloads(8, 300000, seed=2)
    with server.client(shm=shm) as c:
        assert c.shm_active == shm
        assert c.store(keys, pay, dtype="float16", shape=[2, 75000]) == 8
        got = c.retrieve(keys, with_meta=True)
        assert [g[0] for g in got] == pay
        assert got[0][1] == "float16" and got[0][2] == (2, 75000)
        # the prefix only: a key never stored ends it
        other = keys_for("paths", 9)
        assert c.lookup(other) == 8


def test_flipped_byte_is_a_miss(server, tmp_path):
    keys = keys_for("flip", 16)
    pay = random_payloads(16, 64 * 1024, seed=3)
    with server.client() as c:
        assert c.store(keys, pay) == 16
        c.flush()
    server.restart()  # empty L1: reads come from the fs tier
    server.wait_recovered()
    d = tmp_path / "data"
    victim = None
    for f in fs_files(d):
        if keys.hashes[10].hex() in f:
            victim = d / f
    assert victim is not None
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with server.client() as c:
        n = c.lookup(keys)
        assert n == 10  # the prefix stops at the corrupt chunk
        got = c.retrieve(keys)
        assert len(got) == 10 and got == pay[:10]
        st = c.status()["l2"][0]
        assert st["counters"]["corrupt"] == 1


def test_tmp_leftover_is_never_a_hit(make_server, tmp_path):
    """A complete object under a tmp name (a writer killed before its rename)
    is not served, and is removed once its writer is known dead."""
    d = tmp_path / "data"
    s = make_server(data_dir=str(d))
    keys = keys_for("tmp", 2)
    pay = random_payloads(2, 10000, seed=4)
    with s.client() as c:
        c.store(keys[:1], pay[:1])
        c.flush()
    s.kill()
    final = [f for f in fs_files(d)][0]
    # the same bytes under the second key's name, left as a dead writer's tmp
    name2 = final.replace(keys.hashes[0].hex(), keys.hashes[1].hex())
    tmp = d / (name2 + ".tmp.%x-%x-0" % (999999, 12345))
    tmp.write_bytes((d / final).read_bytes())
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys[1:]) == 0
        assert c.lookup(keys) == 1
    assert not tmp.exists()  # pid 999999 is not alive: swept at start-up


def test_capacity_is_a_hard_cap(make_server, tmp_path):
    d = tmp_path / "cap"
    cap_gb = 8.5 * MiB / 2**30  # room for 8 objects of 1 MiB + header
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d), max_capacity_gb=cap_gb)])
    keys = keys_for("cap", 20)
    pay = random_payloads(20, MiB, seed=5)
    with s.client() as c:
        for i in range(20):
            c.store(keys[i:i + 1], pay[i:i + 1])
        c.flush()
        st = c.status()["l2"][0]
    assert st["objects"] == 8
    assert st["used_bytes"] <= st["capacity_bytes"]
    assert st["counters"]["rejected_writes"] == 12
    assert du_bytes(d) == st["used_bytes"] <= cap_gb * 2**30


BAD_ADAPTER_SPECS = [
    ("not json", "invalid JSON"),
    ('{"type": "nope"}', "unknown type \"nope\""),
    ('[1]', "must be a JSON object"),
    ('{"base_path": "/x"}', "\"type\" is missing"),
    ('{"type": "fs"}', "\"base_path\" is required"),
    ('{"type": "fs", "base_path": "/x", "use_odirect": "yes"}', "\"use_odirect\" must be true or false"),
    ('{"type": "fs", "base_path": "/x", "use_odirect": 1}', "\"use_odirect\" must be true or false"),
    ('{"type": "fs", "base_path": "/x", "max_capacity_gb": "lots"}', "\"max_capacity_gb\" must be a number"),
    ('{"type": "fs", "base_path": "/x", "read_ahead_size": -1}', "\"read_ahead_size\" must be between"),
    ('{"type": "fs", "base_path": "/x", "bogus": 1}', "\"bogus\" is not a known field"),
    ('{"type": "fs", "base_path": "/x", "eviction": {"eviction_policy": "MRU"}}', "unknown policy"),
    ('{"type": "fs", "base_path": "/x", "relative_tmp_dir": "../out"}', "\"relative_tmp_dir\""),
    ('{"type": "mock", "max_size_gb": 0, "mock_bandwidth_gb": 1}', "\"max_size_gb\" must be > 0"),
]


@pytest.mark.parametrize("spec,msg", BAD_ADAPTER_SPECS)
def test_bad_config_exits_2_naming_the_key(spec, msg):
    r = run_kvtier("server", "--dry-run", "--l2-adapter", '{"type":"mock","max_size_gb":1,"mock_bandwidth_gb":1}',
                   "--l2-adapter", spec)
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #1" in r.stderr and msg in r.stderr, (spec, r.stderr)


TYPO_SPECS = [
    # a required key mistyped: the typo is named, with the key it is near
    ('{"type": "fs", "base_pth": "/x"}',
     '"base_pth" is not a known field: did you mean "base_path"? ("base_path" is required)'),
    ('{"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": {"file_path": "/x", '
     '"max_capacty_gb": 10}}',
     '"backend_params.max_capacty_gb" is not a known field: did you mean '
     '"backend_params.max_capacity_gb"? ("backend_params.max_capacity_gb" is required)'),
    ('{"type": "nixl_store", "backend": "OBJ", "backend_params": {"buckt": "b"}, "pool_size": 4}',
     '"backend_params.buckt" is not a known field: did you mean "backend_params.bucket"?'),
    ('{"type": "resp", "hots": "127.0.0.1"}', '"hots" is not a known field: did you mean "host"?'),
    ('{"type": "fs", "Base_Path": "/x"}', '"Base_Path" is not a known field: did you mean "base_path"?'),
    # an optional key mistyped: the nearest known one beside the list
    ('{"type": "fs", "base_path": "/x", "use_odirec": true}',
     '"use_odirec" is not a known field: did you mean "use_odirect"? (known: '),
    # nothing near: no guess
    ('{"type": "fs", "zzz": "/x"}', '"base_path" is required'),
    ('{"type": "fs", "base_path": "/x", "bogus": 1}', '"bogus" is not a known field (known: '),
]


@pytest.mark.parametrize("spec,msg", TYPO_SPECS)
def test_typo_of_a_key_names_it_and_the_nearest_known_one(spec, msg):
    env = {k: v for k, v in os.environ.items() if k != "AWS_DEFAULT_BUCKET"}
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter", spec, env=env)
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #0" in r.stderr and msg in r.stderr, (spec, r.stderr)
    if "zzz" in spec or "bogus" in spec:
        assert "did you mean" not in r.stderr


@pytest.mark.parametrize("args", [["--l1-size-gb", "abc"], ["--eviction-ratio", "2"], ["--port", "0"],
                                  ["--l2-store-policy", "sometimes"], ["--eviction-policy", "MRU"],
                                  ["--no-such-flag"]])
def test_bad_flag_exits_2_naming_it(args):
    r = run_kvtier("server", "--dry-run", *args)
    assert r.returncode == 2 and args[0] in r.stderr, (args, r.stderr)


def test_persist_enabled_strings(tmp_path):
    for val, want in [('"false"', False), ('"False"', False), ("false", False), ('"true"', True), ("true", True)]:
        spec = '{"type": "fs", "base_path": "%s", "persist_enabled": %s}' % (tmp_path, val)
        r = run_kvtier("server", "--dry-run", "--l2-adapter", spec)
        assert r.returncode == 0, r.stderr
        cfg = json.loads(r.stdout)
        assert cfg["l2_adapters"][0]["persist_enabled"] is want
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   '{"type": "fs", "base_path": "/x", "persist_enabled": 0}')
    assert r.returncode == 2 and "persist_enabled" in r.stderr


def test_persist_disabled_removes_files_on_close(make_server, tmp_path):
    d = tmp_path / "np"
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d), persist_enabled="false")])
    with s.client() as c:
        c.store(keys_for("np", 3), random_payloads(3, 5000))
        c.flush()
    assert len(fs_files(d)) == 3
    assert s.stop() == 0
    assert fs_files(d) == []


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
    pytest.importorskip("zmq")
    from support.rawproto import RawZmq, keys_body
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


@needs_faultio
def test_sigterm_drains_and_exits_0(make_server, tmp_path):
    """SIGTERM waits for the stores still pending in L2: on a slow disk
    (every write takes 30 ms) most of them have not reached the adapter when
    the signal comes, and all of them are on disk, intact, after exit 0."""
    d = tmp_path / "drain"
    d.mkdir()
    env = {"LD_PRELOAD": FAULTIO, "KVT_FAULTIO": "dir=%s,delay_ms=30" % d}
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d))], env=env)
    keys = keys_for("drain", 10)
    pay = random_payloads(10, MiB)
    with s.client() as c:
        assert c.store(keys, pay) == 10
        cnt = c.status()["l2"][0]["counters"]
    assert cnt["store_ok"] + cnt["store_failed"] < 10, cnt  # still pending at the signal
    assert s.stop() == 0
    assert "draining" in s.read_log()
    assert len(fs_files(d)) == 10
    s.env = None
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.retrieve(keys) == pay
        assert c.status()["l2"][0]["counters"]["load_ok"] == 10


def test_sigterm_with_mock_stores_pending_exits_0(make_server, tmp_path):
    """The shutdown path with stores pending in a slow mock adapter, where
    faultio cannot load (the sanitizer runs): exit 0, the fs copies on disk.
    (That the pending stores are not dropped is test_sigterm_drains_and_exits_0.)"""
    d = tmp_path / "drain"
    s = make_server(["--l2-adapter", adapter_json(type="mock", max_size_gb=1, mock_bandwidth_gb=0.05),
                     "--l2-adapter", adapter_json(type="fs", base_path=str(d))])
    keys = keys_for("drain", 10)
    with s.client() as c:
        assert c.store(keys, random_payloads(10, MiB)) == 10
    assert s.stop() == 0
    assert len(fs_files(d)) == 10


def test_dry_run_prints_resolved_config(tmp_path):
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter",
                   '{"type": "fs", "base_path": "/data/lmcache/l2", "use_odirect": true}')
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    a = cfg["l2_adapters"][0]
    assert a["type"] == "fs" and a["use_odirect"] is True and a["relative_tmp_dir"] == ""
    # L1 default: adaptive (docs/eviction.md, "Choosing a policy")
    assert cfg["l1"]["eviction_policy"] == "adaptive" and cfg["bind"] == "tcp://127.0.0.1:5555"
