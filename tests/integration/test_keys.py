"""Object keys: names are an injective encoding of the key, in every
adapter, across restarts and in the offline scan and purge; key limits are
bytes, reported by hello, and the error names the limit hit.

A `/` in a model written as `-SEP-` (fs, s3, Redis, raw_block and dax
headers compared names that way) or `--` (nixl_store_dynamic, namespaces)
would make `org/model` and `org-SEP-model` (or `x/y` and `x--y`) one
object: stored under one, served for the other. Files written under those
earlier names (tests/data/legacy_names) are still recovered."""

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import struct

import pytest

import kvtier
from support.data import adapter_json, keys_for, random_payloads
from support.redis_servers import REDIS, Redis
from support.s3_servers import NODE, S3Server, s3_json
from support.server import run_kvtier


def legacy_fs_name(model, kv_rank, group, hsh, salt=""):
    """The name LMCache's fs adapter gives (kvtier's earlier fs name too)."""
    return "%s@0x%08x@%x@%s%s.data" % (model.replace("/", "-SEP-"), kv_rank, group, hsh.hex(),
                                        "@" + salt if salt else "")


def files(d, suffix):
    out = []
    for root, _, fs in os.walk(d):
        out += [f for f in fs if f.endswith(suffix)]
    return sorted(out)


# ------------------------------------------------------------ remote tiers


@pytest.fixture
def remote(tmp_path):
    """Start the remote store an adapter spec needs (Redis, S3) on demand."""
    started = []

    def need(kind):
        if kind == "resp":
            if REDIS is None:
                pytest.skip("redis-server is not installed")
            d = tmp_path / "redis"
            d.mkdir()
            r = Redis(d).start()
            started.append(r)
            return json.dumps({"type": "resp", "host": "127.0.0.1", "port": r.port,
                               "key_prefix": "t"}), r
        if NODE is None:
            pytest.skip("node is not installed: no S3-compatible test server")
        d = tmp_path / "s3data"
        d.mkdir()
        srv = S3Server(d).start()
        started.append(srv)
        return s3_json(srv), srv

    yield need
    for x in started:
        x.kill()


def adapter_spec(kind, tmp_path, remote):
    """(--l2-adapter JSON, remote store or None) for one adapter type."""
    if kind == "fs":
        return adapter_json(type="fs", base_path=str(tmp_path / "fs"), max_capacity_gb=1), None
    if kind == "nixl_store_dynamic":
        return adapter_json(type="nixl_store_dynamic", backend="POSIX",
                            backend_params={"file_path": str(tmp_path / "nd"),
                                            "use_direct_io": "false",
                                            "max_capacity_gb": "1"}), None
    if kind == "fs_native":
        return adapter_json(type="fs_native", base_path=str(tmp_path / "fsn"),
                            max_capacity_gb=1), None
    if kind == "dax":
        return adapter_json(type="dax", device_path=str(tmp_path / "dax.img"),
                            max_dax_size_gb=0.02, slot_bytes=256 * 1024), None
    if kind == "nixl_store":
        return adapter_json(type="nixl_store", backend="POSIX", pool_size=4,
                            backend_params={"file_path": str(tmp_path / "ns"),
                                            "use_direct_io": "false",
                                            "file_size": 8 << 20}), None
    if kind == "raw_block":
        img = tmp_path / "rb.img"
        with open(img, "wb") as f:
            f.truncate(48 << 20)
        return adapter_json(type="raw_block", device_path=str(img), slot_bytes=256 * 1024,
                            meta_total_bytes=1 << 20, use_odirect=False), None
    return remote(kind)


PAIRS = [("org/model", "org-SEP-model"), ("x/y", "x--y"), ("-SEP/", "/SEP-")]


@pytest.mark.parametrize("kind", ["fs", "fs_native", "nixl_store_dynamic", "raw_block", "dax",
                                  "nixl_store", "resp", "s3"])
def test_models_that_shared_a_name_are_distinct_objects(make_server, tmp_path, remote, kind):
    """Store under one model of each pair; the other model misses, before and
    after a restart (the start-up scan decodes each name to its own key, the
    slot and value headers are compared exactly); then both hold their own
    bytes, again across a restart. Stores skip L1 so every read is the
    adapter's. nixl_store is volatile: no restart."""
    spec, _ = adapter_spec(kind, tmp_path, remote)
    persistent = kind != "nixl_store"
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec])
    pay = {m: random_payloads(3, 20000, seed=i)
           for i, m in enumerate(m for p in PAIRS for m in p)}

    def restart(objects):
        if persistent:
            s.kill(signal.SIGKILL)
            s.start()
            assert s.wait_recovered()["l2"][0]["recovery"]["objects"] == objects

    with s.client() as c:
        for a, _ in PAIRS:
            assert c.store(keys_for(a, 3), pay[a]) == 3
        c.flush()
        for _, b in PAIRS:
            assert c.lookup(keys_for(b, 3)) == 0, b
        c.free_locks()
    restart(3 * len(PAIRS))
    with s.client() as c:
        for a, b in PAIRS:
            assert c.lookup(keys_for(b, 3)) == 0, b
            c.free_locks()
            assert c.retrieve(keys_for(a, 3)) == pay[a], a
        for _, b in PAIRS:
            assert c.store(keys_for(b, 3), pay[b]) == 3
        c.flush()
        st = c.status()["l2"][0]
    assert st["objects"] == 6 * len(PAIRS)
    restart(6 * len(PAIRS))
    with s.client() as c:
        for a, b in PAIRS:
            assert c.retrieve(keys_for(a, 3)) == pay[a], a
            assert c.retrieve(keys_for(b, 3)) == pay[b], b


def test_fs_names_on_disk(make_server, tmp_path):
    """Unambiguous models keep LMCache's names byte for byte (so files an
    earlier kvtier or LMCache wrote are found again after the upgrade);
    the models that collided get an escape; a restart recovers all."""
    d = tmp_path / "fs"
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(d),
                                                  max_capacity_gb=1)])
    plain = [("meta-llama/Llama-3-8B", ""), ("/models/My_Model/v1", "tenant-1"),
             ("a-SEPb", ""), ("Qwen/Qwen2.5-7B-Instruct", "s_2")]
    want = set()
    pay = {}
    with s.client() as c:
        for i, (m, salt) in enumerate(plain):
            ks = keys_for(m, 2, kv_rank=kvtier.kv_rank(4, 1, 2, 1), group=i, salt=salt)
            pay[(m, salt)] = random_payloads(2, 10000, seed=i)
            assert c.store(ks, pay[(m, salt)]) == 2
            for h in ks.hashes:
                want.add(legacy_fs_name(m, ks.kv_rank, ks.group, h, salt))
        c.flush()
        escaped = {"org-SEP-model": "org%2DSEP-model@", "50%/x": "50%25-SEP-x@",
                   "-SEP/": "%2DSEP-SEP-@"}
        for m in escaped:
            assert c.store(keys_for(m, 1), random_payloads(1, 1000)) == 1
        c.flush()
    names = set(files(d, ".data"))
    assert want <= names
    for m, prefix in escaped.items():
        assert [n for n in names - want if n.startswith(prefix)], (m, sorted(names - want))
    assert len(names) == len(want) + len(escaped)
    s.kill(signal.SIGKILL)
    s.start()
    st = s.wait_recovered()["l2"][0]
    assert st["recovery"]["objects"] == len(names)
    with s.client() as c:
        for i, (m, salt) in enumerate(plain):
            ks = keys_for(m, 2, kv_rank=kvtier.kv_rank(4, 1, 2, 1), group=i, salt=salt)
            assert c.retrieve(ks) == pay[(m, salt)]


def test_offline_scan_and_purge_keep_namespaces_apart(make_server, tmp_path):
    """Namespace names (status, quotas, purge) are the nixl file-name prefix:
    `x/y` is `x--y`, the model `x--y` is `x%2D-y`. An offline purge of one
    leaves the other's files."""
    root = tmp_path / "nd"
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX",
                        backend_params={"file_path": str(root), "use_direct_io": "false",
                                        "max_capacity_gb": "1"})
    s = make_server(["--l2-adapter", spec])
    py = random_payloads(3, 20000, seed=1)
    pl = random_payloads(2, 30000, seed=2)
    with s.client() as c:
        c.store(keys_for("x/y", 3), py)
        c.store(keys_for("x--y", 2), pl)
        c.flush()
        a = c.status()["l2"][0]
    assert set(a["per_namespace_bytes"]) == {"x--y", "x%2D-y"}
    names = files(root, ".bin")
    assert sum(n.startswith("x--y_") for n in names) == 3
    assert sum(n.startswith("x%2D-y_") for n in names) == 2
    s.stop()
    r = run_kvtier("status", "--json", "--root", str(root), "--budget-gb", "1")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["per_namespace_objects"] == {"x--y": 3, "x%2D-y": 2}
    r = run_kvtier("purge", "--root", str(root), "x--y", "--yes", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["result"]["removed"] == 3
    assert [n.split("_")[0] for n in files(root, ".bin")] == ["x%2D-y", "x%2D-y"]
    s.start()
    a = s.wait_recovered()["l2"][0]
    assert a["recovery"]["objects"] == 2
    with s.client() as c:
        assert c.lookup(keys_for("x/y", 3)) == 0
        c.free_locks()
        assert c.retrieve(keys_for("x--y", 2)) == pl


# ------------------------------------------------------------------ limits


def _mp_str(s):
    b = s.encode()
    assert len(b) < 32
    return bytes([0xa0 | len(b)]) + b


def _mp_decode(b, i=0):
    """Enough msgpack for a hello reply: maps, strings, ints, nil, bools."""
    t = b[i]
    if t <= 0x7f:
        return t, i + 1
    if 0x80 <= t <= 0x8f or t == 0xde:
        n, i = (t & 0x0f, i + 1) if t != 0xde else (struct.unpack(">H", b[i + 1:i + 3])[0], i + 3)
        out = {}
        for _ in range(n):
            k, i = _mp_decode(b, i)
            out[k], i = _mp_decode(b, i)
        return out, i
    if 0xa0 <= t <= 0xbf or t in (0xd9, 0xda):
        if t == 0xd9:
            n, i = b[i + 1], i + 2
        elif t == 0xda:
            n, i = struct.unpack(">H", b[i + 1:i + 3])[0], i + 3
        else:
            n, i = t & 0x1f, i + 1
        return b[i:i + n].decode(), i + n
    if t == 0xc0:
        return None, i + 1
    if t in (0xc2, 0xc3):
        return t == 0xc3, i + 1
    fmt = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q", 0xd0: ">b", 0xd1: ">h", 0xd2: ">i",
           0xd3: ">q"}[t]
    n = struct.calcsize(fmt)
    return struct.unpack(fmt, b[i + 1:i + 1 + n])[0], i + 1 + n


def raw_hello(url):
    """One hello over a bare ZeroMQ DEALER (libzmq through ctypes)."""
    z = ctypes.CDLL(ctypes.util.find_library("zmq") or "libzmq.so.5")
    z.zmq_ctx_new.restype = ctypes.c_void_p
    z.zmq_socket.restype = ctypes.c_void_p
    z.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
    z.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    z.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
    z.zmq_recv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    z.zmq_setsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    z.zmq_getsockopt.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_size_t)]
    z.zmq_close.argtypes = [ctypes.c_void_p]
    z.zmq_ctx_term.argtypes = [ctypes.c_void_p]
    ZMQ_DEALER, ZMQ_SNDMORE, ZMQ_RCVMORE, ZMQ_RCVTIMEO, ZMQ_LINGER = 5, 2, 13, 27, 17
    ctx = z.zmq_ctx_new()
    sock = z.zmq_socket(ctx, ZMQ_DEALER)
    v = ctypes.c_int(20000)
    z.zmq_setsockopt(sock, ZMQ_RCVTIMEO, ctypes.byref(v), 4)
    v0 = ctypes.c_int(0)
    z.zmq_setsockopt(sock, ZMQ_LINGER, ctypes.byref(v0), 4)
    try:
        assert z.zmq_connect(sock, url.encode()) == 0
        frames = [b"naming-1", b"hello", b"\x81" + _mp_str("version") + b"\x01"]
        for j, f in enumerate(frames):
            assert z.zmq_send(sock, f, len(f), ZMQ_SNDMORE if j < len(frames) - 1 else 0) == len(f)
        out = []
        buf = ctypes.create_string_buffer(1 << 16)
        while True:
            n = z.zmq_recv(sock, buf, len(buf), 0)
            assert n >= 0, "no hello reply"
            out.append(buf.raw[:n])
            more = ctypes.c_int(0)
            sz = ctypes.c_size_t(4)
            z.zmq_getsockopt(sock, ZMQ_RCVMORE, ctypes.byref(more), ctypes.byref(sz))
            if not more.value:
                break
    finally:
        z.zmq_close(sock)
        z.zmq_ctx_term(ctx)
    assert out[0] == b"naming-1" and struct.unpack("<i", out[1])[0] == 0, out
    return _mp_decode(out[2])[0]


def test_hello_reports_key_limits(server):
    h = raw_hello(server.url)
    assert h["max_model_bytes"] == 128 and h["max_salt_bytes"] == 128
    assert h["max_name_bytes"] == 240
    assert h["version"] == 1 and "max_batch" in h  # the other fields are still there


def test_key_limits_are_bytes_and_errors_name_the_limit(server):
    """128 bytes, not characters; the combined limit is on the encoded
    name (escapes count); each error says which limit was hit."""
    def err(model, salt=""):
        with server.client() as c:
            with pytest.raises(kvtier.KvtierError) as e:
                c.store(keys_for(model, 1, salt=salt), [b"x"])
        assert e.value.name == "E_BADKEY"
        return str(e.value)

    e = "\u00e9"  # two bytes in UTF-8
    assert "max_model_bytes" in err(e * 65)
    assert "max_salt_bytes" in err("m", e * 65)
    with server.client() as c:
        assert c.store(keys_for(e * 64, 1), [b"x"]) == 1
        assert c.store(keys_for("m", 1, salt=e * 64), [b"x"]) == 1
        # fs name: model + "@" + salt + 90 bytes for the longest key = 240
        assert c.store(keys_for("m" * 128, 1, salt="s" * 21), [b"x"]) == 1
        assert c.store(keys_for("%" * 50, 1), [b"x"]) == 1  # 150 bytes escaped
        c.flush()
    msg = err("m" * 128, "s" * 22)
    assert "max_name_bytes" in msg and "241 bytes" in msg, msg
    msg = err("%" * 51)
    assert "max_name_bytes" in msg and "243 bytes" in msg, msg


# ------------------------------------------------------- files of earlier versions

LEGACY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "legacy_names")
LEGACY_MODELS = [("meta-llama/Llama-3-8B", "", 0, 0),
                 ("/models/My_Model/v1", "tenant-1", kvtier.kv_rank(4, 1, 2, 1), 3)]


@pytest.mark.parametrize("kind,sub", [("fs", "fs"), ("nixl_store_dynamic", "nd")])
def test_files_written_before_the_change_are_recovered(make_server, tmp_path, kind, sub):
    """tests/data/legacy_names holds files the kvtier before this change wrote
    (fs and nixl_store_dynamic, models with '/', '-' and '_', a salt, a
    kv_rank and a group): the new codec decodes their names to the same keys,
    so a server started on them recovers and serves every one."""
    spec, _ = adapter_spec(kind, tmp_path, None)
    d = tmp_path / sub
    shutil.copytree(os.path.join(LEGACY, sub), d)
    s = make_server(["--l2-adapter", spec])
    st = s.wait_recovered()["l2"][0]
    assert st["recovery"]["objects"] == 4
    with s.client() as c:
        for i, (m, salt, rank, group) in enumerate(LEGACY_MODELS):
            toks = list(range(i * 100, i * 100 + 32))
            ks = kvtier.chunk_keys(m, toks, chunk_size=16, kv_rank=rank, group=group, salt=salt)
            want = [("legacy %s %d " % (m, j)).encode() * 20 for j in range(len(ks))]
            assert c.retrieve(ks) == want, m
    # the same files, nothing renamed (beside the adapter's directory lock)
    assert sorted(f for f in os.listdir(d) if f != ".kvtier.lock") == \
        sorted(os.listdir(os.path.join(LEGACY, sub)))
