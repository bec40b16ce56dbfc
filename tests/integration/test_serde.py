"""Serde against the real binary: round trips through each serde and chains
on file tiers across a SIGKILL restart, tampering, moved ciphertexts, key
file errors, plaintext never on disk, fp8 error bound, capacity in stored
bytes."""

import ctypes
import json
import math
import os
import random
import struct

import pytest

import kvtier
from support.data import du_bytes, fs_files, keys_for
from support.ports import free_port
from support.server import run_kvtier

KiB = 1 << 10
MiB = 1 << 20

# ---------------------------------------------------------------- helpers

_xx = ctypes.CDLL("libxxhash.so.0")
_xx.XXH3_64bits.restype = ctypes.c_uint64
_xx.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    b = bytes(b)
    return _xx.XXH3_64bits(b, len(b))


def rewrite_header(data, new_hash=None):
    """Recompute an fs object's header checksums after editing it (layout in
    src/l2/kit/objfmt.h), optionally naming another chunk hash: what someone
    who moves or edits files on the storage can do."""
    data = bytearray(data)
    hl = struct.unpack_from("<H", data, 10)[0]
    ml, sl = struct.unpack_from("<HH", data, 52)
    if new_hash is not None:
        data[48] = len(new_hash)
        data[56:88] = new_hash.ljust(32, b"\0")
    struct.pack_into("<Q", data, 32, xxh3(data[hl:]))
    end = 120 + ml + sl
    struct.pack_into("<Q", data, end, xxh3(data[:end]))
    return bytes(data)


def make_key(tmp_path, name="master.key", content=None, mode=0o600):
    p = tmp_path / name
    if content is None:
        content = os.urandom(32)
    p.write_bytes(content)
    os.chmod(p, mode)
    return str(p)


def kv_fp16(n_elems, seed):
    """KV-like fp16 tensor bytes: Gaussian per channel, log-normal channel
    scales, 2 % outlier channels (tests/unit/test_serde_data.h)."""
    r = random.Random(seed)
    ch = []
    for _ in range(256):
        s = math.exp(0.75 * r.gauss(0, 1))
        ch.append(s * 8 if r.random() < 0.02 else s)
    vals = [r.gauss(0, 1) * ch[i % 256] for i in range(n_elems)]
    return struct.pack("<%de" % n_elems, *vals)


def fs_spec(base, serde, **kw):
    d = {"type": "fs", "base_path": str(base)}
    if serde is not None:
        d["serde"] = serde
    d.update(kw)
    return d


def nixl_spec(base, serde, **kw):
    bp = {"file_path": str(base), "use_direct_io": "false", "max_capacity_gb": "10"}
    d = {"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": bp}
    if serde is not None:
        d["serde"] = serde
    d.update(kw)
    return d


def have_type(spec):
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec))
    return "unknown type" not in r.stderr


def serde_status(c):
    return c.status()["l2"][0]


# ------------------------------------------------------------ round trips

LOSSLESS = {
    "checksum": {"type": "checksum"},
    "encrypt256": "ENC256",
    "encrypt128": "ENC128",
    "lz4": {"type": "lz4"},
    "zstd": {"type": "zstd", "level": 3},
    "zstd_nosplit": {"type": "zstd", "byte_split": "false"},
    "chain_checksum_lz4_encrypt": [{"type": "checksum"}, {"type": "lz4"}, "ENC256"],
}
LOSSY = {
    "fp8": {"type": "fp8"},
    "chain_fp8_zstd_encrypt": [{"type": "fp8", "max_workers": 2}, {"type": "zstd"}, "ENC256"],
}


def resolve(serde, keyfile):
    def one(x):
        if x == "ENC256":
            return {"type": "encrypt", "master_key_path": keyfile}
        if x == "ENC128":
            return {"type": "encrypt", "master_key_path": keyfile, "aes_bits": 128}
        return x
    return [one(x) for x in serde] if isinstance(serde, list) else one(serde)


def fp8_check(orig, got):
    """Every element within the documented bound (docs/serde.md):
    |x' - x| <= |x| (1/16 + 2^-11) + amax_block / 2^17."""
    n = len(orig) // 2
    xs = struct.unpack("<%de" % n, orig)
    ys = struct.unpack("<%de" % n, got)
    worst = 0.0
    for b in range(0, n, 128):
        blk = xs[b:b + 128]
        amax = max(abs(v) for v in blk)
        for x, y in zip(blk, ys[b:b + 128]):
            bound = abs(x) * (1 / 16 + 2 ** -11) * (1 + 1e-9) + amax * 2 ** -17 + 2 ** -25
            assert abs(y - x) <= bound, (x, y, amax)
            if abs(x) > amax * 2 ** -6:
                worst = max(worst, abs(y - x) / abs(x))
    return worst


@pytest.mark.parametrize("adapter", ["fs", "nixl_store_dynamic"])
@pytest.mark.parametrize("name", list(LOSSLESS) + list(LOSSY))
def test_round_trip_survives_sigkill(make_server, tmp_path, adapter, name):
    """Store through the serde, SIGKILL, restart: lookup finds every chunk
    and retrieve returns the bytes (exact, or within the fp8 bound with the
    dtype and shape as stored); capacity counts what is on disk."""
    key = make_key(tmp_path)
    serde = resolve(LOSSLESS.get(name) or LOSSY[name], key)
    base = tmp_path / "l2"
    spec = (fs_spec if adapter == "fs" else nixl_spec)(base, serde)
    if not have_type(spec):
        pytest.skip("%s is not in this build yet" % adapter)
    s = make_server(["--l2-adapter", json.dumps(spec)])
    n, elems = 12, 32 * KiB
    keys = keys_for("serde/" + name, n)
    pay = [kv_fp16(elems, seed=i) for i in range(n)]
    with s.client() as c:
        assert c.store(keys, pay, dtype="float16", shape=[elems]) == n
        c.flush()
        st = serde_status(c)
    assert st["serde"]["encoded"] == n and st["serde"]["encode_failed"] == 0
    assert st["logical_bytes"] == n * len(pay[0])
    assert st["used_bytes"] == du_bytes(base)
    s.kill()
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == n
        got = c.retrieve(keys, with_meta=True)
        st = serde_status(c)
    assert len(got) == n
    assert st["serde"]["decoded"] == n and st["serde"]["serde_failures"] == 0
    for (data, dtype, shape), orig in zip(got, pay):
        assert dtype == "float16" and shape == (elems,) and len(data) == len(orig)
        if name in LOSSLESS:
            assert data == orig
        else:
            fp8_check(orig, data)


def test_status_and_capacity_count_stored_bytes(make_server, tmp_path):
    """A cap that holds 8 raw 1 MiB objects holds 15 through fp8; status
    shows logical and stored bytes and their ratio; usage never passes the
    cap and equals the files' size."""
    base = tmp_path / "cap"
    cap_gb = 8.5 * MiB / 2 ** 30
    s = make_server(["--l2-adapter", json.dumps(fs_spec(base, {"type": "fp8"}, max_capacity_gb=cap_gb))])
    keys = keys_for("cap", 20)
    pay = kv_fp16(512 * KiB, seed=1)
    with s.client() as c:
        for i in range(20):
            c.store(keys[i:i + 1], [pay], dtype="float16")
        c.flush()
        st = serde_status(c)
    assert st["objects"] >= 15
    assert st["used_bytes"] <= st["capacity_bytes"] and st["used_bytes"] == du_bytes(base)
    assert st["stored_bytes"] == st["used_bytes"]
    assert st["logical_bytes"] == st["objects"] * MiB
    assert 0.5 < st["stored_to_logical_ratio"] < 0.52
    assert st["counters"]["rejected_writes"] == 20 - st["objects"]
    assert st["serde"]["chain"] == ["fp8"] and st["serde"]["fp8_passthrough"] == 0


# ---------------------------------------------------------- misses on damage

def one_file(base, keys, i):
    for f in fs_files(base):
        if keys.hashes[i].hex() in f:
            return base / f
    raise AssertionError("no file for chunk %d" % i)


@pytest.mark.parametrize("serde,counter", [
    ({"type": "checksum"}, "checksum_mismatches"),
    ("ENC256", "decrypt_failures"),
])
def test_tampered_byte_is_a_miss(make_server, tmp_path, serde, counter):
    """A flipped payload byte whose header checksum was recomputed (so the
    engine's own check passes) is caught by the serde: the lookup prefix
    stops there, the earlier chunks are served, the counter says why."""
    base = tmp_path / "t"
    s = make_server(["--l2-adapter", json.dumps(fs_spec(base, resolve(serde, make_key(tmp_path))))])
    keys = keys_for("tamper", 12)
    pay = [os.urandom(20000) for _ in range(12)]
    with s.client() as c:
        assert c.store(keys, pay) == 12
        c.flush()
    s.kill()
    victim = one_file(base, keys, 7)
    data = bytearray(victim.read_bytes())
    data[len(data) - 100] ^= 0x01
    victim.write_bytes(rewrite_header(data))
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 7
        assert c.retrieve(keys) == pay[:7]
        st = serde_status(c)
    assert st["serde"][counter] >= 1  # once per lookup that reached it
    assert st["counters"]["corrupt"] == 0  # the engine saw a consistent file


def test_moved_ciphertext_is_a_miss(make_server, tmp_path):
    """An encrypted object copied over another key's file, with the header
    rewritten to name that key (so the engine's identity and checksum
    checks pass), fails the GCM tag: the key identity is the associated
    data. Same for a copy into another tenant's (cache_salt) name."""
    base = tmp_path / "mv"
    serde = {"type": "encrypt", "master_key_path": make_key(tmp_path)}
    s = make_server(["--l2-adapter", json.dumps(fs_spec(base, serde))])
    keys = keys_for("moved", 4)
    pay = [os.urandom(30000) for _ in range(4)]
    with s.client() as c:
        assert c.store(keys, pay) == 4
        c.flush()
    s.kill()
    src = one_file(base, keys, 0).read_bytes()
    dst = one_file(base, keys, 2)
    dst.write_bytes(rewrite_header(src, new_hash=keys.hashes[2]))
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys[2:3]) == 0
        assert c.lookup(keys[:2]) == 2
        st = serde_status(c)
    assert st["serde"]["decrypt_failures"] == 1
    assert st["counters"]["corrupt"] == 0


def test_other_chain_or_key_is_a_miss(make_server, tmp_path):
    """Objects written under one master key are misses for an adapter with
    another key on the same directory (recognised by the chain id in the
    header, not even tried: chain_mismatches) and stay readable with the
    right key; an adapter without serde never serves them either."""
    base = tmp_path / "k"
    k1, k2 = make_key(tmp_path, "k1"), make_key(tmp_path, "k2")
    keys = keys_for("rotate", 5)
    pay = [os.urandom(10000) for _ in range(5)]
    spec1 = fs_spec(base, {"type": "encrypt", "master_key_path": k1})
    s = make_server(["--l2-adapter", json.dumps(spec1)])
    with s.client() as c:
        assert c.store(keys, pay) == 5
        c.flush()
    s.kill()
    s2 = make_server(["--l2-adapter", json.dumps(fs_spec(base, {"type": "encrypt", "master_key_path": k2}))])
    s2.wait_recovered()
    with s2.client() as c:
        assert c.lookup(keys) == 0
        st = serde_status(c)
    assert st["serde"]["chain_mismatches"] >= 1 and st["serde"]["decrypt_failures"] == 0
    s2.kill()
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 5 and c.retrieve(keys) == pay
    s.kill()
    # without serde: encoded objects are larger than their logical length
    # (the engine refuses to read them) or name a chain: misses, kept
    s3 = make_server(["--l2-adapter", json.dumps(fs_spec(base, None))])
    s3.wait_recovered()
    with s3.client() as c:
        assert c.lookup(keys) == 0
        st = serde_status(c)
    assert st["counters"]["load_failed"] >= 1 and st["counters"]["load_ok"] == 0
    s3.kill()
    s.start()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 5 and c.retrieve(keys) == pay


def test_encrypted_files_hold_no_plaintext(make_server, tmp_path):
    base = tmp_path / "enc"
    serde = [{"type": "zstd"}, {"type": "encrypt", "master_key_path": make_key(tmp_path)}]
    s = make_server(["--l2-adapter", json.dumps(fs_spec(base, serde))])
    marker = b"TOP-SECRET-PROMPT-TEXT:"
    pay = [(marker + os.urandom(9)) * 2000 for _ in range(3)]
    with s.client() as c:
        assert c.store(keys_for("secret", 3), pay) == 3
        c.flush()
    files = [os.path.join(r, f) for r, _, fs in os.walk(base) for f in fs if f != ".kvtier.lock"]
    assert len(files) == 3
    for f in files:
        raw = open(f, "rb").read()
        assert marker not in raw and b"TOP-SECRET" not in raw
        assert all(p[40:72] not in raw for p in pay)
    log = s.read_log()
    key_bytes = open(tmp_path / "master.key", "rb").read()
    assert key_bytes.hex() not in log


# --------------------------------------------------------- bad key files

def test_bad_key_file_exits_2(tmp_path):
    """Missing, readable by others, wrong length, not hex: exit 2 at
    start-up (and in --dry-run), naming the adapter and the field, and
    never printing key material."""
    hexkey = os.urandom(32).hex()
    cases = [
        (str(tmp_path / "missing.key"), "No such file"),
        (make_key(tmp_path, "open.key", hexkey.encode(), 0o644), "group or others"),
        (make_key(tmp_path, "short.key", os.urandom(31)), "32 raw bytes or 64 hex"),
        (make_key(tmp_path, "nothex.key", b"g" * 64), "32 raw bytes or 64 hex"),
        (make_key(tmp_path, "long.key", (hexkey + "00").encode()), "32 raw bytes or 64 hex"),
    ]
    for path, msg in cases:
        spec = fs_spec(tmp_path / "d", [{"type": "zstd"}, {"type": "encrypt", "master_key_path": path}])
        for extra in (["--dry-run"], ["--port", str(free_port()), "--http-port", "0"]):
            r = run_kvtier("server", *extra, "--l2-adapter", json.dumps(spec))
            assert r.returncode == 2, (path, r.stderr)
            assert "--l2-adapter #0 (fs)" in r.stderr and "serde[1].master_key_path" in r.stderr
            assert msg in r.stderr, r.stderr
            assert hexkey not in r.stderr and hexkey not in r.stdout
    good = make_key(tmp_path, "good.key", (hexkey + "\n").encode(), 0o400)
    spec = fs_spec(tmp_path / "d", {"type": "encrypt", "master_key_path": good})
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec))
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["l2_adapters"][0]
    assert a["serde"] == {"type": "encrypt", "master_key_path": good, "aes_bits": 256,
                          "key_provider": "hkdf", "max_workers": 1}
    assert hexkey not in r.stdout


BAD_SERDE = [
    ('"zstd"', "must be an object or an array"),
    ('[]', "at least one serde"),
    ('{"type": "gzip"}', '"serde.type" must be one of checksum, encrypt, fp8, lz4, zstd'),
    ('[{"type": "zstd", "level": 99}]', '"serde[0].level" must be between'),
    ('[{"type": "fp8"}, {"type": "lz4", "byte_split": 1}]', '"serde[1].byte_split" must be true or false'),
    ('{"type": "fp8", "fp8_dtype": "float8_e5m2"}', '"serde.fp8_dtype" must be one of'),
    ('{"type": "fp8", "max_workers": 0}', '"serde.max_workers" must be between'),
    ('{"type": "checksum", "sha": true}', '"serde.sha" is not a known field'),
    ('{"type": "encrypt", "master_key_path": "/k", "aes_bits": "192"}', '"serde.aes_bits"'),
]


@pytest.mark.parametrize("serde,msg", BAD_SERDE)
def test_bad_serde_config_exits_2(tmp_path, serde, msg):
    spec = '{"type": "fs", "base_path": "%s", "serde": %s}' % (tmp_path, serde)
    r = run_kvtier("server", "--dry-run", "--l2-adapter", spec)
    assert r.returncode == 2, (serde, r.stderr)
    assert "--l2-adapter #0 (fs)" in r.stderr and msg in r.stderr, (serde, r.stderr)


# -------------------------------------------------------------- fp8 dtypes

def test_fp8_passthrough_for_raw_bytes_is_exact(make_server, tmp_path):
    """fp8 only quantizes declared fp16/bf16 payloads: raw bytes (no dtype)
    come back bit-exact and are counted."""
    base = tmp_path / "p"
    s = make_server(["--l2-adapter", json.dumps(fs_spec(base, {"type": "fp8"}))])
    keys = keys_for("passthrough", 3)
    pay = [os.urandom(5000) for _ in range(3)]
    with s.client() as c:
        assert c.store(keys, pay) == 3
        c.flush()
        assert serde_status(c)["serde"]["fp8_passthrough"] == 3
    s.restart()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 3 and c.retrieve(keys) == pay


def test_serde_under_fault_inject(make_server, tmp_path):
    """A chain on the adapter wrapped by fault_inject: the injected gap trims
    the prefix after decoding, the bytes before it are exact; a chain on
    both the wrapper and its inner adapter is refused."""
    key = make_key(tmp_path)
    inner = fs_spec(tmp_path / "fi", [{"type": "zstd"}, {"type": "encrypt", "master_key_path": key}])
    spec = {"type": "fault_inject", "gap_indices": [5], "inner": inner}
    s = make_server(["--l2-adapter", json.dumps(spec)])
    keys = keys_for("fi", 8)
    pay = [os.urandom(9000) for _ in range(8)]
    with s.client() as c:
        assert c.store(keys, pay) == 8
        c.flush()
    s.restart()
    s.wait_recovered()
    with s.client() as c:
        assert c.lookup(keys) == 5
        got = c.retrieve(keys)  # a second load batch: the gap may fall elsewhere
        assert len(got) >= 5 and got == pay[:len(got)]
        st = serde_status(c)
    assert st["fault_inject"]["dropped_loads"] >= 1 and st["serde"]["decoded"] >= 5
    s.stop()  # one server per directory: the refusal below is about serde
    twice = dict(spec, serde={"type": "checksum"})
    r = run_kvtier("server", "--port", str(free_port()), "--http-port", "0",
                   "--l2-adapter", json.dumps(twice))
    assert r.returncode != 0 and '"serde" is given twice' in r.stderr, r.stderr
