"""The admin API (docs/operations.md, "The admin API") against a real
server with an fs and a Redis L2: every endpoint and `kvtier` subcommand,
their refusals (bad JSON, unknown keys, a quota below its use, pins over
the bound, an unknown namespace) changing nothing, and their effects: a
pinned object survives an eviction storm, a warmed namespace is served
from L1 with no L2 read, verify finds and removes an object damaged on
disk, a quota set at run time holds across a restart, and nothing changes
without the admin credential when authentication is on."""

import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

import kvtier
from support.data import fs_files, keys_for, random_payloads
from support.paths import BIN
from support.redis_servers import REDIS, Redis, resp_json
from support.server import run_kvtier, wait_for

pytestmark = pytest.mark.skipif(not REDIS, reason="redis-server is not installed")


def http(server, method, path, body=None, token=None, raw=None):
    """(status, JSON reply) of one admin request."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (server.http_port, path), data=data,
                                 method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "{}")


def cli(server, *args, token_file=None):
    """Run `kvtier ARGS --http URL` against server."""
    extra = ["--http", "http://127.0.0.1:%d" % server.http_port]
    if token_file:
        extra += ["--token", token_file]
    return run_kvtier(*(list(args) + extra))


def names(server, **q):
    path = "/admin/objects?limit=10000" + "".join("&%s=%s" % kv for kv in q.items())
    st, o = http(server, "GET", path)
    assert st == 200, o
    return sorted((x["tier"], x["name"]) for x in o["objects"])


def metric(server, line):
    st, text = server.http_get("/metrics")
    for l in text.splitlines():
        if l.startswith(line + " "):
            return float(l.split()[-1])
    raise AssertionError("no metric " + line)


@pytest.fixture
def stack(make_server, tmp_path):
    """A server with fs[0] (its quotas in a file) and resp[1] (a real Redis)."""
    r = Redis(tmp_path).start()
    q = tmp_path / "quotas.json"
    q.write_text("{}")
    fs = json.dumps({"type": "fs", "base_path": str(tmp_path / "fs"), "namespace_quotas": str(q)})
    s = make_server(["--l2-adapter", fs, "--l2-adapter", resp_json(r)])
    s.redis, s.quotas, s.fsdir = r, q, tmp_path / "fs"
    yield s
    r.kill()


def fill(server, model, n, salt="", size=4096, seed=0):
    keys = keys_for(model, n, seed=seed, salt=salt)
    with server.client() as c:
        assert c.store(keys, random_payloads(n, size, seed=seed)) == n
        c.flush()
    return keys


def obj_names(keys):
    """The names the listing gives keys (nixl layout, without .bin)."""
    ns = keys.model.replace("/", "--")
    return ["%s_%08x_%x_%s%s" % (ns, keys.kv_rank, keys.group, h.hex(),
                                 "@" + keys.salt if keys.salt else "") for h in keys.hashes]


# -------------------------------------------------------------- listing


def test_list_filters_pages_and_refusals(stack):
    a = fill(stack, "m/a", 3, salt="t1")
    fill(stack, "m/b", 2, seed=1)
    tiers = {t for t, _ in names(stack)}
    assert tiers == {"l1", "fs[0]", "resp[1]"}
    assert len(names(stack)) == 15  # 5 objects in each of three tiers
    assert [n for _, n in names(stack, tier="fs%5B0%5D", salt="t1")] == sorted(obj_names(a))
    assert len(names(stack, model="m/b")) == 6
    assert len(names(stack, namespace="m--a", tier="resp%5B1%5D")) == 3
    assert len(names(stack, prefix="m--b_", tier="l1")) == 2
    # pages of 4 with the cursor cover every object once
    seen, cursor = [], ""
    while cursor is not None:
        st, o = http(stack, "GET", "/admin/objects?limit=4&cursor=" + cursor)
        assert st == 200 and len(o["objects"]) <= 4
        seen += [(x["tier"], x["name"]) for x in o["objects"]]
        cursor = o["next_cursor"]
    assert sorted(seen) == names(stack)
    # refusals name the problem
    st, o = http(stack, "GET", "/admin/objects?namespace=nope")
    assert st == 404 and o["field"] == "namespace" and "unknown namespace" in o["error"]
    st, o = http(stack, "GET", "/admin/objects?tier=fs9")
    assert st == 400 and o["field"] == "tier"
    st, o = http(stack, "GET", "/admin/objects?cursor=x.y")
    assert st == 400 and "cursor" in o["error"]
    st, o = http(stack, "GET", "/admin/nothing")
    assert st == 404
    # the CLI: a table, --json, every page with --all
    r = cli(stack, "list", "--namespace", "m--a", "--tier", "l1")
    assert r.returncode == 0 and r.stdout.count("m--a_") == 3 and "TIER" in r.stdout, r.stderr
    r = cli(stack, "list", "--json", "--limit", "2", "--all")
    assert r.returncode == 0 and len(json.loads(r.stdout)["objects"]) == 15
    r = cli(stack, "list", "--limit", "0")
    assert r.returncode == 2 and "--limit" in r.stderr
    r = cli(stack, "list", "--bogus")
    assert r.returncode == 2 and "--bogus" in r.stderr
    r = cli(stack, "list", "--namespace", "nope")
    assert r.returncode == 1 and "unknown namespace" in r.stderr


# ------------------------------------------------------------- removals


def test_delete_by_keys_names_and_prefix(stack):
    a = fill(stack, "m/a", 4)
    b = fill(stack, "m/b", 3, seed=1)
    before = names(stack)
    # refusals change nothing
    st, o = http(stack, "POST", "/admin/delete", raw=b'{"keys": ')
    assert st == 400 and "JSON" in o["error"]
    st, o = http(stack, "POST", "/admin/delete", {"keys": {"model": "m/a", "hashes": ["zz"]}})
    assert st == 400 and o["field"] == "keys"
    st, o = http(stack, "POST", "/admin/delete", {"keys": {"names": obj_names(a)[:1]}, "x": 1})
    assert st == 400 and o["field"] == "x"
    ghost = obj_names(keys_for("m/a", 9, seed=5))[8]
    st, o = http(stack, "POST", "/admin/delete", {"keys": {"names": obj_names(a)[:1] + [ghost]}})
    assert st == 404 and o["unknown"] == [ghost]
    assert names(stack) == before
    # by key (model + hashes): gone from every tier, Redis included
    st, o = http(stack, "POST", "/admin/delete",
                 {"keys": {"model": "m/a", "hashes": [a.hashes[0].hex()]}})
    assert st == 200 and o["removed_l1"] == 1 and o["removed_l2"] == {"fs[0]": 1, "resp[1]": 1}
    assert not any(n == obj_names(a)[0] for _, n in names(stack))
    assert len(stack.redis.keys("t*")) == 6
    # by name, with the CLI
    r = cli(stack, "delete", obj_names(a)[1])
    assert r.returncode == 0 and "removed: 1 from L1, 2 from L2" in r.stdout, r.stdout + r.stderr
    # by prefix: one model's objects only
    r = cli(stack, "delete", "--prefix", "m--b_", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["matched"] == 3, r.stderr
    assert {n[:4] for _, n in names(stack)} == {"m--a"} and len(names(stack)) == 6
    r = cli(stack, "delete", "--prefix", "m--zzz")
    assert r.returncode == 1 and "no object's name starts with" in r.stderr
    r = cli(stack, "delete", "--salt", "x", obj_names(a)[2])
    assert r.returncode == 2 and "--salt" in r.stderr
    assert metric(stack, 'kvtier_admin_operations_total{op="delete"}') == 3
    assert metric(stack, 'kvtier_admin_removed_objects_total{op="delete"}') == 3 + 3 + 9


def test_clear_one_tier(stack):
    fill(stack, "m/a", 5)
    st, o = http(stack, "POST", "/admin/clear", {"tier": "l2"})
    assert st == 400 and o["field"] == "tier"
    st, o = http(stack, "POST", "/admin/clear", {})
    assert st == 400 and o["field"] == "tier"
    assert len(names(stack)) == 15
    r = cli(stack, "clear", "l1")
    assert r.returncode == 0 and "l1: 5 object(s) removed" in r.stdout, r.stdout + r.stderr
    assert {t for t, _ in names(stack)} == {"fs[0]", "resp[1]"}
    r = cli(stack, "clear", "resp[1]", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == 5
    assert {t for t, _ in names(stack)} == {"fs[0]"} and stack.redis.keys("t*") == []
    r = cli(stack, "clear")
    assert r.returncode == 2
    assert metric(stack, 'kvtier_admin_removed_objects_total{op="clear"}') == 10


# ---------------------------------------------------------------- quotas


def test_quota_set_at_run_time_holds_across_a_restart(stack):
    fill(stack, "m/a", 4, size=8192)  # 4 objects in fs[0]
    used = stack.client().status()["l2"][0]["per_namespace_bytes"]["m--a"]
    # below what the namespace holds: refused, nothing written
    r = cli(stack, "quota", "m/a", "--set", str(used - 1), "--adapter", "fs[0]")
    assert r.returncode == 1 and "already holds %d bytes" % used in r.stderr, r.stderr
    assert json.loads(stack.quotas.read_text()) == {}
    st, o = http(stack, "PUT", "/admin/quotas", {"name": "m/a", "max_bytes": used - 1,
                                                 "adapter": "fs[0]"})
    assert st == 409 and o["used_bytes"] == used
    st, o = http(stack, "PUT", "/admin/quotas", {"name": "a@b", "max_bytes": 5})
    assert st == 400 and "not a namespace name" in o["error"]
    # resp[1] keeps no quotas file: a change for every adapter is refused
    st, o = http(stack, "PUT", "/admin/quotas", {"name": "m/a", "max_bytes": used * 10})
    assert st == 409 and "resp[1] keeps no quotas file" in o["error"]
    # at the use exactly: the next write of the namespace is refused
    r = cli(stack, "quota", "m/a", "--set", str(used), "--adapter", "fs[0]")
    assert r.returncode == 0 and "limit %d bytes" % used in r.stdout, r.stdout + r.stderr
    r = cli(stack, "quota", "@t9", "--set-gb", "1", "--adapter", "fs[0]")
    assert r.returncode == 0, r.stderr
    assert json.loads(stack.quotas.read_text()) == {"m--a": {"max_bytes": used},
                                                    "@t9": {"max_bytes": 1 << 30}}
    fill(stack, "m/a", 2, size=8192, seed=7)
    fs = stack.client().status()["l2"][0]
    assert fs["counters"]["quota_rejections"] == 2
    # a restart reads the file: the quota is there and holds
    stack.restart()
    stack.wait_recovered()
    r = cli(stack, "quota", "--json")
    q = json.loads(r.stdout)["fs[0]"]
    assert q["m--a"]["quota_bytes"] == used and q["m--a"]["used_bytes"] == used
    assert q["@t9"]["quota_bytes"] == 1 << 30
    fill(stack, "m/a", 1, size=8192, seed=8)
    assert stack.client().status()["l2"][0]["counters"]["quota_rejections"] == 1
    # removed: the file loses it, writes go through
    r = cli(stack, "quota", "m--a", "--delete", "--adapter", "fs[0]")
    assert r.returncode == 0 and "removed" in r.stdout
    assert json.loads(stack.quotas.read_text()) == {"@t9": {"max_bytes": 1 << 30}}
    r = cli(stack, "quota", "m--a", "--adapter", "fs[0]")
    assert r.returncode == 1 and "no quota named" in r.stderr
    fill(stack, "m/a", 1, size=8192, seed=9)
    assert stack.client().status()["l2"][0]["counters"]["quota_rejections"] == 1


def test_tenant_quota_caps_every_namespace_of_a_salt(stack):
    fill(stack, "m/a", 2, salt="team")
    used = stack.client().status()["l2"][0]["bytes_by_cache_salt"]["team"]
    per = used // 2  # one object as fs[0] stores it
    st, o = http(stack, "PUT", "/admin/quotas", {"name": "@team", "max_bytes": used + per,
                                                 "adapter": "fs[0]"})
    assert st == 200 and o["adapters"]["fs[0]"]["used_bytes"] == used, o
    fill(stack, "m/b", 2, salt="team", seed=1)  # another model, same tenant: one fits
    fill(stack, "m/b", 2, salt="other", seed=2)  # another tenant: not capped
    fs = stack.client().status()["l2"][0]
    assert fs["counters"]["quota_rejections"] == 1
    assert fs["bytes_by_cache_salt"]["team"] == used + per
    st, o = http(stack, "GET", "/admin/quotas?name=@team")
    assert st == 200 and o["adapters"]["fs[0]"]["rejected_writes"] == 1


# ------------------------------------------------------------------ pins


def test_pinned_object_survives_an_eviction_storm(make_server, tmp_path):
    ev = {"eviction_policy": "LRU", "trigger_watermark": 0.8, "eviction_ratio": 0.3}
    fs = json.dumps({"type": "fs", "base_path": str(tmp_path / "fs"), "max_capacity_gb": 0.004,
                     "eviction": ev})
    s = make_server(["--l2-adapter", fs, "--eviction-interval-ms", "50", "--max-pinned-mb", "1",
                     "--eviction-trigger-watermark", "0.5"])
    # a small L1 (--l1-size-gb 0.25 is the harness's; the pool fills with 64 KiB objects)
    keep = fill(s, "sys/prompt", 2, size=64 * 1024)
    r = cli(s, "pin", *obj_names(keep))
    assert r.returncode == 0 and "pinned 2 key(s)" in r.stdout, r.stdout + r.stderr
    # more than the bound (1 MiB): refused, nothing pinned
    big = fill(s, "big", 20, size=64 * 1024, seed=3)
    st, o = http(s, "POST", "/admin/pin", {"keys": {"names": obj_names(big)}})
    assert st == 409 and "over the bound" in o["error"]
    st, o = http(s, "POST", "/admin/pin", {"keys": {"names": ["ghost_00000000_0_00"]}})
    assert st == 404 and o["unknown"] == ["ghost_00000000_0_00"]
    st, pins = http(s, "GET", "/admin/pins")
    assert len(pins["objects"]) == 2 and pins["pinned_bytes"] == 2 * 64 * 1024
    # the storm: L1 (256 MiB) and fs (4 MiB) both evict many times over
    for i in range(40):
        fill(s, "storm", 100, size=64 * 1024, seed=100 + i)
    st = s.client().status()
    assert st["l2"][0]["counters"]["evictions"] > 100
    assert st["l1"]["counters"]["evictions"] > 100
    kept = names(s, model="sys/prompt")
    assert kept == sorted([("l1", n) for n in obj_names(keep)] +
                          [("fs[0]", n) for n in obj_names(keep)])
    with s.client() as c:
        assert c.lookup(keep) == 2
        assert c.retrieve(keep) == random_payloads(2, 64 * 1024)
    assert metric(s, "kvtier_admin_pinned_objects") == 2
    assert metric(s, "kvtier_admin_pinned_bytes") == 2 * 64 * 1024
    # unpinned, the next storm takes them
    r = cli(s, "unpin", *obj_names(keep))
    assert r.returncode == 0 and "unpinned 2" in r.stdout
    r = cli(s, "unpin", obj_names(keep)[0])
    assert r.returncode == 1 and "not pinned" in r.stderr
    for i in range(40):
        fill(s, "storm2", 100, size=64 * 1024, seed=200 + i)
    assert names(s, model="sys/prompt") == []


# ------------------------------------------------------------------ jobs


def test_warmed_namespace_is_served_from_l1_without_l2_reads(stack):
    keys = fill(stack, "m/warm", 12, size=16384)
    fill(stack, "m/cold", 4, seed=1)
    stack.restart()  # L1 empty: everything is in fs[0] and resp[1]
    stack.wait_recovered()
    assert {t for t, _ in names(stack)} == {"fs[0]", "resp[1]"}
    st, o = http(stack, "POST", "/admin/warm", {"namespace": "never--seen"})
    assert st == 404 and o["field"] == "namespace"
    st, o = http(stack, "POST", "/admin/warm", {"keys": {"names": []}})
    assert st == 400
    r = cli(stack, "warm", "--namespace", "m--warm")
    assert r.returncode == 0 and "12 loaded into L1" in r.stdout, r.stdout + r.stderr
    assert len(names(stack, tier="l1")) == 12
    with stack.client() as c:
        before = [a["counters"] for a in c.status()["l2"]]
        l1_hits = c.status()["l1"]["counters"]["hits"]
        assert c.lookup(keys) == 12
        assert c.retrieve(keys) == random_payloads(12, 16384)
        st = c.status()
    after = [a["counters"] for a in st["l2"]]
    for b, a in zip(before, after):  # no L2 lookup, no L2 read
        assert a["lookups"] == b["lookups"] and a["load_ok"] == b["load_ok"]
    assert st["l1"]["counters"]["hits"] >= l1_hits + 12
    assert st["admin"]["counters"]["warmed_objects"] == 12
    assert metric(stack, "kvtier_admin_warmed_objects_total") == 12
    job = st["admin"]["jobs"][-1]
    assert job["kind"] == "warm" and job["state"] == "done" and job["progress"] == 1.0
    # warming keys already in L1 loads nothing
    r = cli(stack, "warm", "--json", *obj_names(keys)[:3])
    o = json.loads(r.stdout)
    assert r.returncode == 0 and o["warmed"] == 0 and o["already"] == 3


def test_verify_finds_and_removes_an_object_damaged_on_disk(stack):
    keys = fill(stack, "m/v", 6, size=32768)
    victim = [f for f in fs_files(stack.fsdir) if keys.hashes[2].hex() in f][0]
    p = stack.fsdir / victim
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))
    st, o = http(stack, "POST", "/admin/verify", {"tier": "l1"})
    assert st == 400 and o["field"] == "tier"
    st, o = http(stack, "POST", "/admin/verify", {"namespace": "nope"})
    assert st == 404
    r = cli(stack, "verify", "--tier", "fs[0]", "--json")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "done" and job["total"] == 6 and job["done"] == 6
    assert job["corrupt"] == 1 and job["removed"] == 1
    assert job["corrupt_objects"] == [obj_names(keys)[2]]
    assert not p.exists()
    assert ("fs[0]", obj_names(keys)[2]) not in names(stack)
    assert metric(stack, "kvtier_admin_corrupt_objects_total") == 1
    assert stack.client().status()["l2"][0]["counters"]["corrupt"] == 1
    # a clean pass over every adapter, with the table
    r = cli(stack, "verify")
    assert r.returncode == 0 and "11 read, 0 corrupt" in r.stdout, r.stdout + r.stderr


# ----------------------------------------------------------- credentials


def keygen(d, name):
    r = subprocess.run([BIN, "keygen", os.path.join(d, name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(d, name + ".pub")) as f:
        pub = [l.strip() for l in f if l.strip() and not l.startswith("#")][0]
    return os.path.join(d, name + ".key"), os.path.join(d, name + ".pub"), pub


def token_file(path):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("adm-" + os.urandom(16).hex() + "\n")
    return path


def test_nothing_changes_without_the_admin_credential(make_server, tmp_path, monkeypatch):
    d = str(tmp_path)
    skey, spub, _ = keygen(d, "server")
    akey, _, apub = keygen(d, "ops")
    (tmp_path / "clients").write_text("%s rw * admin name=ops\n" % apub)
    monkeypatch.setenv("KVTIER_SERVER_KEY", spub)
    monkeypatch.setenv("KVTIER_CLIENT_KEY", akey)
    q = tmp_path / "q.json"
    q.write_text("{}")
    fs = json.dumps({"type": "fs", "base_path": str(tmp_path / "fs"), "namespace_quotas": str(q)})
    auth = ["--auth-key", skey, "--auth-clients", str(tmp_path / "clients"), "--l2-adapter", fs]
    # authentication on, no --admin-token: the admin API is closed to all
    s = make_server(auth)
    keys = fill(s, "m/a", 3)
    for method, path, body in [("GET", "/admin/objects", None),
                               ("POST", "/admin/delete", {"prefix": "m"}),
                               ("POST", "/admin/clear", {"tier": "l1"}),
                               ("PUT", "/admin/quotas", {"name": "m/a", "max_bytes": 1 << 30})]:
        st, o = http(s, method, path, body)
        assert st == 403 and "--admin-token" in o["error"], (path, o)
    r = cli(s, "clear", "l1")
    assert r.returncode == 1 and "403" in r.stderr
    s.kill()
    # with --admin-token: no token or a wrong one is 401, and changes nothing
    tok = token_file(str(tmp_path / "admin.token"))
    s = make_server(auth + ["--admin-token", tok])
    s.wait_recovered()
    good = open(tok).read().strip()
    for token in (None, "wrong-" + "x" * 20):
        for method, path, body in [("POST", "/admin/delete", {"keys": {"names": obj_names(keys)}}),
                                   ("POST", "/admin/clear", {"tier": "fs[0]"}),
                                   ("PUT", "/admin/quotas", {"name": "m/a", "max_bytes": 1}),
                                   ("POST", "/admin/verify", {}),
                                   ("POST", "/admin/pin", {"keys": {"names": obj_names(keys)}})]:
            st, o = http(s, method, path, body, token=token)
            assert st == 401, (path, o)
    st, o = http(s, "GET", "/admin/objects", token=good)
    assert st == 200 and len(o["objects"]) == 3  # nothing deleted or cleared
    assert json.loads(q.read_text()) == {}
    st, o = http(s, "GET", "/admin/pins", token=good)
    assert o["objects"] == []
    assert metric(s, 'kvtier_admin_refused_total{reason="credential"}') == 10
    # the token opens it, and the CLI reads it from a file
    r = cli(s, "delete", "--prefix", "m--a", token_file=tok)
    assert r.returncode == 0, r.stderr
    st, o = http(s, "GET", "/admin/objects", token=good)
    assert o["objects"] == []


def test_without_auth_only_loopback_and_flags(make_server, tmp_path):
    s = make_server(["--no-l2", "--http-host", "0.0.0.0", "--insecure-no-auth"])
    fill(s, "m/a", 2)
    st, o = http(s, "GET", "/admin/objects")  # from loopback: open
    assert st == 200 and len(o["objects"]) == 2
    # the same server reached through a non-loopback address of this host
    import socket
    addr = None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect(("10.255.255.255", 1))
            addr = u.getsockname()[0]
    except OSError:
        pass
    if addr and not addr.startswith("127."):
        req = urllib.request.Request("http://%s:%d/admin/clear" % (addr, s.http_port),
                                     data=b'{"tier": "l1"}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403 and b"loopback" in e.value.read()
        st, o = http(s, "GET", "/admin/objects")
        assert len(o["objects"]) == 2
    r = run_kvtier("server", "--max-pinned-mb", "-1", "--dry-run")
    assert r.returncode == 2 and "--max-pinned-mb" in r.stderr
    r = run_kvtier("server", "--admin-token", str(tmp_path / "none"), "--dry-run")
    assert r.returncode == 2 and "--admin-token" in r.stderr
