"""Authentication and tenant isolation (docs/security.md): CURVE on
the RPC socket, the authorized-clients file, E_DENIED, the HTTP bearer token,
the refusal to listen beyond loopback without authentication, and no secret
in logs, --dry-run or status."""

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
import zmq

import kvtier
from support.paths import BIN
from support.ports import free_port
from support.rawproto import RawLocal, RawZmq, hello_body, keys_body, mp_pack, mp_unpack

E_DENIED = -1017
E_TIMEOUT = -1012


def keygen(d, name):
    r = subprocess.run([BIN, "keygen", os.path.join(d, name)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return os.path.join(d, name + ".key"), os.path.join(d, name + ".pub")


def z85(path):
    """The key in a keygen file (first line that is not a comment)."""
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")][0]


@pytest.fixture
def keys(tmp_path):
    d = str(tmp_path / "keys")
    os.mkdir(d)
    k = {n: keygen(d, n) for n in ("server", "alice", "bob", "carol", "admin", "mallory")}
    token = os.path.join(d, "http.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("tok-" + os.urandom(16).hex() + "\n")
    k["token"] = token
    return k


def clients_file(keys, path, names=("alice", "bob", "carol", "admin")):
    lines = {
        "alice": "%s rw team-a name=alice" % z85(keys["alice"][1]),
        "bob": "%s rw team-b,@none name=bob   # two tenants" % z85(keys["bob"][1]),
        "carol": "%s ro team-a name=carol" % z85(keys["carol"][1]),
        "admin": "%s rw * admin name=ops" % z85(keys["admin"][1]),
    }
    with open(path, "w") as f:
        f.write("# kvtier authorized clients\n\n")
        for n in names:
            f.write(lines[n] + "\n")
    return path


@pytest.fixture
def auth_server(make_server, keys, tmp_path, monkeypatch):
    """A server with CURVE on; the test process's default key is the admin's
    (the fixture's readiness probe and plain kvtier.Client() use it)."""
    monkeypatch.setenv("KVTIER_SERVER_KEY", keys["server"][1])
    monkeypatch.setenv("KVTIER_CLIENT_KEY", keys["admin"][0])

    def make(extra=(), names=("alice", "bob", "carol", "admin")):
        cf = clients_file(keys, str(tmp_path / "clients"), names)
        return make_server(["--no-l2", "--auth-key", keys["server"][0], "--auth-clients", cf]
                           + list(extra))
    return make


def client(server, keys, who, **kw):
    kw.setdefault("connect_timeout_ms", 1000)
    return kvtier.Client(server.url, server_key=keys["server"][1], client_key=keys[who][0], **kw)


def wait_counter(server, keys, field, at_least):
    """status.auth[field] once it reaches at_least (handshake failures are
    counted by the server's monitor after the client gave up)."""
    deadline = time.time() + 10
    while True:
        with client(server, keys, "admin") as c:
            v = c.status()["auth"][field]
        if v >= at_least or time.time() > deadline:
            return v
        time.sleep(0.05)


def test_keygen_writes_private_secret_and_never_overwrites(tmp_path):
    key, pub = keygen(str(tmp_path), "k")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert len(z85(key)) == 40 and len(z85(pub)) == 40 and z85(key) != z85(pub)
    r = subprocess.run([BIN, "keygen", str(tmp_path / "k")], capture_output=True, text=True)
    assert r.returncode == 2 and "never overwritten" in r.stderr


def test_unauthenticated_clients_are_refused_and_counted(auth_server, keys, monkeypatch):
    s = auth_server()
    with client(s, keys, "alice") as c:
        c.ping()
    # no key at all
    monkeypatch.delenv("KVTIER_CLIENT_KEY")
    monkeypatch.delenv("KVTIER_SERVER_KEY")
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(s.url, connect_timeout_ms=500, shm=False)
    assert e.value.code == E_TIMEOUT and "KVTIER_SERVER_KEY" in str(e.value)
    # a key pair that is not in the authorized-clients file: the client is
    # told at the handshake
    with pytest.raises(kvtier.KvtierError) as e:
        client(s, keys, "mallory", connect_timeout_ms=5000)
    assert e.value.code == E_DENIED and "authorized-clients" in str(e.value)
    # a listed client key, but a wrong server key
    with pytest.raises(kvtier.KvtierError):
        kvtier.Client(s.url, server_key=keys["mallory"][1], client_key=keys["alice"][0],
                      connect_timeout_ms=500)
    monkeypatch.setenv("KVTIER_SERVER_KEY", keys["server"][1])
    monkeypatch.setenv("KVTIER_CLIENT_KEY", keys["admin"][0])
    assert wait_counter(s, keys, "handshakes_refused", 1) >= 1  # mallory
    assert wait_counter(s, keys, "handshakes_failed", 2) >= 2  # no key, wrong server key
    assert "refused a connection" in s.read_log()
    # the server is unaffected
    assert s.proc.poll() is None
    with client(s, keys, "alice") as c:
        k = kvtier.Keys("m", [b"\x01" * 32], salt="team-a")
        assert c.store(k, [b"x" * 100]) == 1
        assert c.lookup(k) == 1


def test_removed_key_is_refused_after_restart(auth_server, keys, tmp_path):
    s = auth_server()
    with client(s, keys, "bob") as c:
        c.ping()
    s.kill()
    clients_file(keys, str(tmp_path / "clients"), ("alice", "carol", "admin"))
    s.start()
    with pytest.raises(kvtier.KvtierError) as e:
        client(s, keys, "bob", connect_timeout_ms=5000)
    assert e.value.code == E_DENIED
    assert wait_counter(s, keys, "handshakes_refused", 1) >= 1
    with client(s, keys, "alice") as c:
        c.ping()


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "inline"])
def test_tenant_cannot_touch_another_tenants_objects(auth_server, keys, shm):
    s = auth_server()
    ka = kvtier.Keys("m", [bytes([i]) * 32 for i in range(3)], salt="team-a")
    with client(s, keys, "alice", shm=shm) as a:
        assert a.store(ka, [b"A" * 4096] * 3) == 3
        a.flush()
    with client(s, keys, "bob", shm=shm) as b:
        for call in (lambda: b.lookup(ka), lambda: b.retrieve(ka), lambda: b.delete(ka),
                     lambda: b.store(ka, [b"B" * 4096] * 3), lambda: b.status()):
            with pytest.raises(kvtier.KvtierError) as e:
                call()
            assert e.value.code == E_DENIED, e.value
        if shm:
            with pytest.raises(kvtier.KvtierError) as e:
                b.retrieve_view(ka).__enter__()
            assert e.value.code == E_DENIED
        # its own tenants work: a listed salt and no salt (@none)
        kb = kvtier.Keys("m", [b"\x07" * 32], salt="team-b")
        kn = kvtier.Keys("m", [b"\x08" * 32])
        assert b.store(kb, [b"b"]) == 1 and b.store(kn, [b"n"]) == 1
        assert b.lookup(kb) == 1 and b.lookup(kn) == 1
    # purge spans every tenant's salt: operators only
    rz = RawZmq(s.url, curve=(z85(keys["server"][1]).encode(), z85(keys["bob"][1]).encode(),
                              z85(keys["bob"][0]).encode()))
    try:
        r = rz.call([b"1", b"purge", mp_pack({"namespace": "m"})])
        assert r.status == E_DENIED and r.body["error"] == "E_DENIED"
        r = rz.call([b"2", b"purge", mp_pack({"all": True})])
        assert r.status == E_DENIED
        h = rz.call([b"3", b"hello", hello_body()])
        # with authentication the same-host socket comes with a ticket for this key
        assert h.status == 0 and h.body["local"] and len(h.body["ticket"]) == 32
    finally:
        rz.close()
    # alice's objects are whole
    with client(s, keys, "alice", shm=shm) as a:
        assert a.lookup(ka) == 3
        assert [bytes(x) for x in a.retrieve(ka)] == [b"A" * 4096] * 3
    with client(s, keys, "admin") as adm:
        st = adm.status()
        denied = {c["name"]: c["denied"] for c in st["auth"]["clients"]}
        assert denied["bob"] >= 7 and denied["alice"] == 0
    code, body = s.http_get("/metrics")
    assert code == 200 and 'kvtier_auth_denied_total{client="bob"}' in body


def test_read_only_key_cannot_store_or_delete(auth_server, keys):
    s = auth_server()
    k = kvtier.Keys("m", [b"\x02" * 32], salt="team-a")
    with client(s, keys, "alice") as a:
        assert a.store(k, [b"v" * 64]) == 1
    for shm in (True, False):
        with client(s, keys, "carol", shm=shm) as c:
            assert c.lookup(k) == 1
            assert [bytes(x) for x in c.retrieve(k)] == [b"v" * 64]
            k2 = kvtier.Keys("m", [b"\x03" * 32], salt="team-a")
            for call in (lambda: c.store(k2, [b"w"]), lambda: c.delete(k)):
                with pytest.raises(kvtier.KvtierError) as e:
                    call()
                assert e.value.code == E_DENIED and "read-only" in str(e.value)
            if shm:
                with pytest.raises(kvtier.KvtierError) as e:
                    c.store_view(k2, [16]).__enter__()
                assert e.value.code == E_DENIED
    with client(s, keys, "alice") as a:
        assert a.lookup(k) == 1
        assert a.lookup(kvtier.Keys("m", [b"\x03" * 32], salt="team-a")) == 0


def test_bad_auth_config_exits_2_naming_the_flag(keys, tmp_path):
    cf = clients_file(keys, str(tmp_path / "clients"))
    srv = keys["server"][0]
    open_key = str(tmp_path / "open.key")
    with open(open_key, "w") as f:
        f.write(z85(srv) + "\n")
    os.chmod(open_key, 0o644)
    bad_clients = str(tmp_path / "bad")
    with open(bad_clients, "w") as f:
        f.write("%s rw team-a\nnot-a-key rw *\n" % z85(keys["alice"][1]))
    dup = str(tmp_path / "dup")
    with open(dup, "w") as f:
        f.write("%s rw a\n%s ro b\n" % (z85(keys["alice"][1]), z85(keys["alice"][1])))
    cases = [
        (["--auth-key", srv], "--auth-clients"),
        (["--auth-clients", cf], "--auth-key"),
        (["--auth-key", open_key, "--auth-clients", cf], "too open"),
        (["--auth-key", keys["server"][1], "--auth-clients", cf], "--auth-key"),  # 0644 .pub
        (["--auth-key", srv, "--auth-clients", bad_clients], "line 2"),
        (["--auth-key", srv, "--auth-clients", dup], "listed twice"),
        (["--host", "0.0.0.0"], "--host"),
        (["--bind", "tcp://*:5999"], "--host"),
        (["--http-host", "0.0.0.0"], "--http-host"),
        (["--lmcache-port", "5998", "--lmcache-host", "0.0.0.0"], "--lmcache-port"),
        # with authentication the LMCache port is a Unix socket of the
        # server's uid, acting as one named client
        (["--auth-key", srv, "--auth-clients", cf, "--lmcache-port", "5998"], "--lmcache-host"),
        (["--auth-key", srv, "--auth-clients", cf, "--lmcache-port", "5998", "--lmcache-host",
          "ipc:///tmp/x"], "--lmcache-client"),
        (["--auth-key", srv, "--auth-clients", cf, "--lmcache-port", "5998", "--lmcache-host",
          "ipc:///tmp/x", "--lmcache-client", "nosuch"], "names no client"),
        (["--auth-key", srv, "--auth-clients", cf, "--lmcache-port", "5998", "--lmcache-host",
          "127.0.0.1", "--lmcache-client", "alice", "--insecure-no-auth"], "--lmcache-host"),
        (["--lmcache-port", "5998", "--lmcache-client", "alice"], "--lmcache-client"),
        (["--http-token", open_key], "--http-token"),
    ]
    for args, needle in cases:
        r = subprocess.run([BIN, "server", "--no-l2", "--dry-run"] + args, capture_output=True,
                           text=True)
        assert r.returncode == 2 and needle in r.stderr, (args, r.stderr)
    # beyond loopback is allowed with authentication, or when asked for
    for args in (["--host", "0.0.0.0", "--auth-key", srv, "--auth-clients", cf],
                 ["--auth-key", srv, "--auth-clients", cf, "--lmcache-port", "5998",
                  "--lmcache-host", "ipc:///tmp/x", "--lmcache-client", "alice"],
                 ["--lmcache-port", "5998", "--lmcache-host", "ipc:///tmp/x"],
                 ["--host", "0.0.0.0", "--http-host", "0.0.0.0", "--insecure-no-auth"],
                 ["--http-host", "0.0.0.0", "--http-token", keys["token"]]):
        r = subprocess.run([BIN, "server", "--no-l2", "--dry-run"] + args, capture_output=True,
                           text=True)
        assert r.returncode == 0, (args, r.stderr)


def test_client_refuses_an_open_secret_key_file(auth_server, keys, tmp_path):
    s = auth_server()
    leaky = str(tmp_path / "leaky.key")
    with open(leaky, "w") as f:
        f.write(z85(keys["alice"][0]) + "\n")
    os.chmod(leaky, 0o640)
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(s.url, server_key=keys["server"][1], client_key=leaky)
    assert "too open" in str(e.value)
    with pytest.raises(kvtier.KvtierError) as e:
        kvtier.Client(s.url, server_key=None, client_key=str(tmp_path / "missing.key"))
    assert "missing.key" in str(e.value)


def test_http_token_and_insecure_mode(make_server, keys):
    s = make_server(["--no-l2", "--http-token", keys["token"]])
    assert s.http_get("/healthz")[0] == 200
    assert s.http_get("/status")[0] == 401 and s.http_get("/metrics")[0] == 401
    tok = z85(keys["token"])
    for path in ("/status", "/metrics"):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (s.http_port, path),
                                     headers={"Authorization": "Bearer " + tok})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (s.http_port, path),
                                     headers={"Authorization": "Bearer " + tok[:-1] + "x"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
    s2 = make_server(["--no-l2", "--insecure-no-auth"])
    code, body = s2.http_get("/healthz")
    assert code == 200 and "insecure" in body
    with s2.client() as c:
        st = c.status()
    assert st["auth"]["insecure_no_auth"] is True and st["auth"]["enabled"] is False
    assert "--insecure-no-auth" in s2.read_log()


def test_no_secret_in_logs_dry_run_or_status(auth_server, keys, tmp_path):
    secrets = [z85(keys[n][0]) for n in ("server", "alice", "bob", "carol", "admin", "mallory")]
    secrets.append(z85(keys["token"]))
    s = auth_server(["--log-level", "debug", "--http-token", keys["token"]])
    outputs = []
    with client(s, keys, "alice") as a:
        a.store(kvtier.Keys("m", [b"\x05" * 32], salt="team-a"), [b"z"])
    with client(s, keys, "bob") as b:
        with pytest.raises(kvtier.KvtierError) as e:
            b.lookup(kvtier.Keys("m", [b"\x05" * 32], salt="team-a"))
        outputs.append(str(e.value))
    with pytest.raises(kvtier.KvtierError) as e:
        client(s, keys, "mallory", connect_timeout_ms=300)
    outputs.append(str(e.value))
    with client(s, keys, "admin") as adm:
        outputs.append(repr(adm.status()))
    req = urllib.request.Request("http://127.0.0.1:%d/status" % s.http_port,
                                 headers={"Authorization": "Bearer " + z85(keys["token"])})
    with urllib.request.urlopen(req, timeout=10) as r:
        outputs.append(r.read().decode())
    # the command-line tools take the key pair from the environment (admin's)
    r = subprocess.run([BIN, "status", "--url", s.url, "--json"], capture_output=True, text=True)
    assert r.returncode == 0 and '"auth"' in r.stdout, r.stderr
    outputs += [r.stdout, r.stderr]
    cf = str(tmp_path / "clients")
    r = subprocess.run([BIN, "server", "--no-l2", "--dry-run", "--auth-key", keys["server"][0],
                        "--auth-clients", cf, "--http-token", keys["token"]],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert z85(keys["server"][1]) in r.stdout  # the public key is shown
    outputs += [r.stdout, r.stderr]
    r = subprocess.run([BIN, "keygen", str(tmp_path / "new")], capture_output=True, text=True)
    secrets.append(z85(str(tmp_path / "new.key")))
    outputs += [r.stdout, r.stderr]
    s.stop()
    outputs.append(s.read_log())
    text = "\n".join(outputs)
    assert "E_DENIED" in text and "refused a connection" in text
    for sec in secrets:
        assert sec not in text


def test_remote_tier_credentials_not_shown_by_dry_run():
    """The Redis password and the S3 secret are read but --dry-run says
    only that they are set."""
    for spec, secret in (
            ('{"type":"resp","host":"127.0.0.1","port":6379,"password":"hunter2-pw-xyz"}',
             "hunter2-pw-xyz"),
            ('{"type":"s3","s3_endpoint":"s3://b","s3_region":"us-west-2","aws_access_key_id":"AK",'
             '"aws_secret_access_key":"s3-secret-xyz"}', "s3-secret-xyz")):
        r = subprocess.run([BIN, "server", "--dry-run", "--no-storage-check", "--l2-adapter", spec],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "<set>" in r.stdout and secret not in r.stdout + r.stderr


OTHER_UID_PROBE = r"""
import json, os, socket, struct, sys
name, pid, fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = {"uid": os.getuid()}
try:
    os.open("/proc/%d/fd/%d" % (pid, fd), os.O_RDWR)
    out["map"] = "opened"
except OSError as e:
    out["map"] = e.__class__.__name__
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect("\0" + name[1:])
    frames = [b"r", b"ping", b"\x80"]
    s.sendall(struct.pack("<I", 3) + b"".join(struct.pack("<I", len(f)) + f for f in frames))
    out["reply"] = s.recv(64).hex()
except OSError as e:
    out["reply"] = e.__class__.__name__
print(json.dumps(out))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a probe as another uid "
                    "(this machine has no sudo); the uid check itself is the kernel's")
def test_another_uid_can_neither_connect_nor_map_the_pool(make_server):
    """Same host without authentication: the abstract socket (SO_PEERCRED)
    and the memfd pool (/proc/PID/fd) are the server's uid's only."""
    s = make_server(["--no-l2"])
    z = RawZmq(s.url)
    try:
        h = z.call([b"h", b"hello", hello_body()]).body
    finally:
        z.close()
    assert h["local"] and h["shm"]

    def as_nobody():
        os.setgid(65534)
        os.setuid(65534)
    r = subprocess.run(["/usr/bin/python3", "-c", OTHER_UID_PROBE, h["local"], str(h["shm"]["pid"]),
                        str(h["shm"]["fd"])], capture_output=True, text=True, preexec_fn=as_nobody,
                       cwd="/")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["uid"] == 65534
    assert out["map"] == "PermissionError"
    assert out["reply"] in ("", "ConnectionResetError", "BrokenPipeError"), out
    # the server's own uid gets both
    with s.client() as c:
        assert c.shm_active and c.local_active


def test_same_host_socket_needs_the_key_too(auth_server, keys):
    """With authentication the same-host socket stays (two thread hops less
    than ZeroMQ), but a connection there is nobody's until its first hello
    presents the single-use ticket that a hello over CURVE gave a key: a
    same-uid process without a key, a made-up ticket, a used one get
    E_DENIED and nothing else; a bound connection is its key's, with the
    key's tenants and rights."""
    s = auth_server()
    curve = lambda who: (z85(keys["server"][1]).encode(), z85(keys[who][1]).encode(),
                         z85(keys[who][0]).encode())
    ka = kvtier.Keys("m", [bytes([i]) * 32 for i in range(3)], salt="team-a")
    kb = kvtier.Keys("m", [b"\x09" * 32], salt="team-b")
    # the C client (and so the Python binding) binds its same-host connection
    with client(s, keys, "alice") as a:
        assert a.local_active
        assert a.store(ka, [b"A" * 4096] * 3) == 3
        a.flush()
        assert a.lookup(ka) == 3 and [bytes(x) for x in a.retrieve(ka)] == [b"A" * 4096] * 3
        with pytest.raises(kvtier.KvtierError) as e:  # still alice's tenants only
            a.lookup(kb)
        assert e.value.code == E_DENIED
        assert a.local_active
    with client(s, keys, "carol") as c:  # read-only stays read-only
        assert c.local_active and c.lookup(ka) == 3
        with pytest.raises(kvtier.KvtierError) as e:
            c.store(ka, [b"C" * 4096] * 3)
        assert e.value.code == E_DENIED

    z = RawZmq(s.url, curve=curve("alice"))
    try:
        h = z.call([b"h", b"hello", hello_body()])
    finally:
        z.close()
    assert h.status == 0, h
    name, ticket = h.body["local"], h.body["ticket"]
    # no key: nothing but E_DENIED, whatever the request
    nobody = RawLocal(name)
    try:
        for i, frames in enumerate([[b"hello", hello_body()], [b"ping", mp_pack({})],
                                    [b"lookup", keys_body(ka)],
                                    [b"hello", mp_pack({"version": 1, "ticket": b"\0" * 32})],
                                    [b"hello", mp_pack({"version": 1, "ticket": ticket[:16]})],
                                    [b"hello", mp_pack({"version": 1, "ticket": "text"})]]):
            r = nobody.call([b"n%d" % i] + frames)
            assert r.status == E_DENIED and r.body["error"] == "E_DENIED", (frames[0], r)
            assert "ticket" in r.body["message"], r  # what to do, not a key "not in the file"
    finally:
        nobody.close()
    # alice's ticket binds a connection to alice, once
    bound = RawLocal(name)
    try:
        r = bound.call([b"b1", b"hello", mp_pack({"version": 1, "ticket": ticket})])
        assert r.status == 0 and "ticket" not in r.body, r
        r = bound.call([b"b2", b"lookup", keys_body(ka)])
        assert r.status == 0 and r.body["hits"] == 3, r
        r = bound.call([b"b3", b"lookup", keys_body(kb)])
        assert r.status == E_DENIED, r
    finally:
        bound.close()
    again = RawLocal(name)
    try:
        r = again.call([b"a1", b"hello", mp_pack({"version": 1, "ticket": ticket})])
        assert r.status == E_DENIED, r  # single use
    finally:
        again.close()
    with client(s, keys, "admin") as adm:
        sh = adm.status()["auth"]["same_host"]
    # every refusal on an unbound same-host connection counts: the six of
    # `nobody` (hellos and other requests alike) and the reused ticket
    assert sh["enabled"] and sh["denied"] == 7 and sh["bound"] >= 3, sh
    code, body = s.http_get("/metrics")
    assert code == 200 and "kvtier_auth_same_host_denied_total" in body


def test_sighup_reloads_the_authorized_clients_file(auth_server, keys, tmp_path):
    """kill -HUP (systemctl reload) reads the authorized-clients file again:
    a removed key's open connections (CURVE and same-host) get E_DENIED from
    the next request on and it cannot connect again; a changed line takes
    effect on open connections; a new key connects. A file that does not
    load keeps the keys in use (logged, counted). The denied counters go on."""
    s = auth_server(names=("alice", "bob", "admin"))
    ka = kvtier.Keys("m", [b"\x01" * 32], salt="team-a")
    kb = kvtier.Keys("m", [b"\x02" * 32], salt="team-b")
    with client(s, keys, "bob") as b, client(s, keys, "bob", local=False) as b_tcp, \
            client(s, keys, "alice") as a:
        assert b.local_active and not b_tcp.local_active
        assert b.store(kb, [b"B" * 100]) == 1 and b_tcp.lookup(kb) == 1
        with pytest.raises(kvtier.KvtierError) as e:
            a.lookup(kb)
        assert e.value.code == E_DENIED
        # bob goes, alice gets team-b too, carol comes
        path = str(tmp_path / "clients")
        with open(path, "w") as f:
            f.write("%s rw team-a,team-b name=alice\n" % z85(keys["alice"][1]))
            f.write("%s ro team-a name=carol\n" % z85(keys["carol"][1]))
            f.write("%s rw * admin name=ops\n" % z85(keys["admin"][1]))
        s.proc.send_signal(signal.SIGHUP)
        assert wait_counter(s, keys, "reloads", 1) == 1
        with client(s, keys, "admin") as adm:
            au = adm.status()["auth"]
        assert au["reloads"] == 1 and au["generation"] == 1 and au["reload_failures"] == 0, au
        assert sorted(c["name"] for c in au["clients"]) == ["alice", "carol", "ops"]
        assert [c["denied"] for c in au["clients"] if c["name"] == "alice"] == [1]  # carried
        for conn in (b, b_tcp):  # the open connections of the removed key
            with pytest.raises(kvtier.KvtierError) as e:
                conn.lookup(kb)
            assert e.value.code == E_DENIED, e.value
        assert a.lookup(kb) == 1 and [bytes(x) for x in a.retrieve(kb)] == [b"B" * 100]
        assert a.store(ka, [b"A"]) == 1
    with pytest.raises(kvtier.KvtierError) as e:  # bob cannot come back
        with client(s, keys, "bob") as b2:
            b2.ping()
    assert e.value.code == E_DENIED
    with client(s, keys, "carol") as c:
        assert c.lookup(ka) == 1
    # a broken file: the keys in use stay
    with open(str(tmp_path / "clients"), "w") as f:
        f.write("not-a-key rw *\n")
    s.proc.send_signal(signal.SIGHUP)
    assert wait_counter(s, keys, "reload_failures", 1) == 1
    with client(s, keys, "admin") as adm:
        au = adm.status()["auth"]
    assert au["reload_failures"] == 1 and au["generation"] == 1, au
    with client(s, keys, "alice") as a:
        assert a.lookup(kb) == 1
    log = s.read_log()
    assert "SIGHUP: reloaded" in log and "the 3 key(s) in use stay" in log
    code, body = s.http_get("/metrics")
    assert 'kvtier_auth_reloads_total{result="failed"} 1' in body


def test_sighup_without_auth_keeps_serving(make_server):
    s = make_server(["--no-l2"])
    s.proc.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    with s.client() as c:
        c.ping()
    assert s.proc.poll() is None and "nothing to reload" in s.read_log()


def io_threads_of(pid):
    names = []
    for t in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
            names.append(f.read().strip())
    return sum(n.startswith("ZMQbg/IO/") for n in names)


def test_curve_connections_spread_over_io_threads(auth_server, keys, tmp_path):
    """CURVE encrypts on the I/O thread that owns a connection: a server with
    --auth-key gets half the CPUs (1..4) of them by default, --io-threads N
    sets it, and 4 clients storing and retrieving inline at once over CURVE
    get their own bytes back. Without authentication one is the default;
    bad values exit 2 naming the flag."""
    ncpu = os.cpu_count()
    want = max(1, min(4, ncpu // 2))
    s = auth_server()
    assert io_threads_of(s.proc.pid) == want
    for extra, n in (([], 1), (["--io-threads", "3"], 3)):
        r = subprocess.run([BIN, "server", "--dry-run", "--no-storage-check"] + extra,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and json.loads(r.stdout)["io_threads"] == n, r.stderr
    for bad in ("0", "65", "x"):
        r = subprocess.run([BIN, "server", "--dry-run", "--io-threads", bad],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "--io-threads" in r.stderr, r.stderr
    s3 = auth_server(["--io-threads", "3"])
    assert io_threads_of(s3.proc.pid) == 3
    errors = []

    def worker(i):
        try:
            with client(s3, keys, "admin", shm=False) as c:
                for j in range(8):
                    k = kvtier.Keys("m", [bytes([i, j]) * 16])
                    v = bytes([i * 16 + j]) * (256 << 10)
                    assert c.store(k, [v]) == 1
                    assert [bytes(x) for x in c.retrieve(k)] == [v]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


# ------------------------------------------------ the LMCache front end

LMC_LOOKUP, LMC_QUERY, LMC_REGISTER, LMC_PREPARE_STORE, LMC_CLEAR, LMC_CHUNK_SIZE = 8, 9, 14, 16, 20, 21


class RawLmc:
    """LMCache's framing (docs/lmcache-protocol.md): [uid][op][one msgpack
    document per argument] from a DEALER, over pyzmq."""

    def __init__(self, url):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)
        self.uid = 0

    def call(self, op, *args, timeout_ms=5000):
        """(op frame, result) of the reply, or None when none came."""
        self.uid += 1
        self.sock.send_multipart([mp_pack(self.uid), mp_pack(op)] + [mp_pack(a) for a in args])
        if not self.sock.poll(timeout_ms):
            return None
        f = self.sock.recv_multipart()
        assert mp_unpack(f[0]) == self.uid
        return mp_unpack(f[1]), (mp_unpack(f[2]) if len(f) > 2 else None)

    def close(self):
        self.sock.close()
        self.ctx.term()


def lmc_key(salt, rid="r1", worker=None, chunks=2, chunk=256):
    return {"model_name": "m/lmc", "world_size": 1, "worker_id": worker,
            "token_ids": list(range(1, chunks * chunk + 1)), "start": 0, "end": chunks * chunk,
            "request_id": rid, "cache_salt": salt, "request_configs": None, "num_kv_readers": 1}


LMC_CONTEXT = {"instance_id": 42, "model_name": "m/lmc", "world_size": 1, "block_size": 16,
               "num_layers": 2, "hidden_dim_size": 64, "dtype_str": "float16", "use_mla": False,
               "num_physical_slots": 256}

@pytest.fixture
def short_dir():
    """A directory of the given mode under /tmp (a Unix socket path holds at
    most 107 bytes, and pytest's tmp_path is 0700 to other uids)."""
    made = []

    def make(mode):
        d = tempfile.mkdtemp(prefix="kvt-lmc-")
        os.chmod(d, mode)
        made.append(d)
        return d
    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


OTHER_UID_LMC = r"""
import json, os, sys, zmq
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.connect(sys.argv[1])
d.send_multipart([b"\x01", b"\x15"])  # uid 1, get_chunk_size (21)
r = d.recv_multipart() if d.poll(1500) else None
print(json.dumps({"uid": os.getuid(), "reply": [f.hex() for f in r] if r else None}))
"""


def test_lmcache_port_with_auth_is_the_servers_uid_acting_as_one_client(auth_server, keys,
                                                                          tmp_path, short_dir):
    """--auth-key with --lmcache-port: the LMCache front end listens on a Unix
    socket made 0600, its ZAP handler admits only the server's uid
    (SO_PEERCRED), and every request acts as --lmcache-client's line: other
    salts and, for a read-only line, stores are denied and served as a miss
    or nothing to store (vLLM recomputes; an error would fail its step),
    counted per client; clear needs admin. A reload that changes the line
    applies at once; one that removes it refuses new connections."""
    run = short_dir(0o700)
    host = "ipc://%s/lmc" % run
    sock = "%s/lmc:5556" % run
    s = auth_server(["--lmcache-port", "5556", "--lmcache-host", host, "--lmcache-client", "alice"],
                    names=("alice", "bob", "admin"))
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(sock).st_mode)
    c = RawLmc("ipc://" + sock)
    try:
        assert c.call(LMC_CHUNK_SIZE) == (LMC_CHUNK_SIZE, 256)
        assert c.call(LMC_REGISTER, LMC_CONTEXT)[0] == LMC_REGISTER
        # alice's tenant: slots to write; another salt: nothing, no error
        op, r = c.call(LMC_PREPARE_STORE, lmc_key("team-a", worker=0), 42)
        assert op == LMC_PREPARE_STORE and len(r["context"]["slots"]) == 2, r
        op, r = c.call(LMC_PREPARE_STORE, lmc_key("team-b", worker=0), 42)
        assert op == LMC_PREPARE_STORE and r["context"]["slots"] == [], r
        assert c.call(LMC_LOOKUP, lmc_key("team-b", rid="rb"), 1) == (LMC_LOOKUP, None)
        assert c.call(LMC_QUERY, "rb") == (LMC_QUERY, 0)
        op, _ = c.call(LMC_CLEAR, False)
        assert isinstance(op, str) and "E_DENIED" in op and "admin" in op, op
        with client(s, keys, "admin") as adm:
            st = adm.status()
        assert st["lmcache"]["auth"] == {"client": "alice", "denied_requests": 3,
                                         "connections_refused": 0}, st["lmcache"]
        assert [x["denied"] for x in st["auth"]["clients"] if x["name"] == "alice"] == [3]
        # alice becomes read-only: her stores are denied on the open connection
        path = str(tmp_path / "clients")
        with open(path, "w") as f:
            f.write("%s ro team-a name=alice\n" % z85(keys["alice"][1]))
            f.write("%s rw * admin name=ops\n" % z85(keys["admin"][1]))
        s.proc.send_signal(signal.SIGHUP)
        assert wait_counter(s, keys, "reloads", 1) == 1
        op, r = c.call(LMC_PREPARE_STORE, lmc_key("team-a", rid="r2", worker=0), 42)
        assert r["context"]["slots"] == [], r
        assert c.call(LMC_LOOKUP, lmc_key("team-a", rid="r3"), 1) == (LMC_LOOKUP, None)
        # alice goes: the open connection is denied, a new one is refused
        with open(path, "w") as f:
            f.write("%s rw * admin name=ops\n" % z85(keys["admin"][1]))
        s.proc.send_signal(signal.SIGHUP)
        assert wait_counter(s, keys, "reloads", 2) == 2
        op, r = c.call(LMC_PREPARE_STORE, lmc_key("team-a", rid="r4", worker=0), 42)
        assert r["context"]["slots"] == [], r
    finally:
        c.close()
    c2 = RawLmc("ipc://" + sock)
    try:
        assert c2.call(LMC_CHUNK_SIZE, timeout_ms=1500) is None
    finally:
        c2.close()
    with client(s, keys, "admin") as adm:
        st = adm.status()
    assert st["lmcache"]["auth"]["denied_requests"] == 5, st["lmcache"]
    assert st["auth"]["lmcache_connections_refused"] >= 1
    assert "--lmcache-client alice is no longer one client" in s.read_log()
    code, body = s.http_get("/metrics")
    assert "kvtier_auth_lmcache_refused_total " in body
    s.stop()
    assert not os.path.exists(sock)  # removed at stop (libzmq leaves it)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a probe as another uid")
def test_lmcache_port_refuses_another_uid_and_a_second_server(auth_server, keys, tmp_path,
                                                              short_dir):
    """Even with the socket file opened to everyone (chmod 666, a mistake),
    another uid gets no reply: ZAP refuses it. A SIGKILLed server's socket is
    replaced by the next; a running server's is not taken over."""
    run = short_dir(0o755)  # nobody must reach the socket: ZAP, not the path, refuses
    host = "ipc://%s/lmc" % run
    sock = "%s/lmc:5557" % run
    extra = ["--lmcache-port", "5557", "--lmcache-host", host, "--lmcache-client", "alice"]
    s = auth_server(extra)
    os.chmod(sock, 0o666)

    def as_nobody():
        os.setgid(65534)
        os.setuid(65534)
    r = subprocess.run(["/usr/bin/python3", "-c", OTHER_UID_LMC, "ipc://" + sock],
                       capture_output=True, text=True, preexec_fn=as_nobody, cwd="/")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["uid"] == 65534 and out["reply"] is None, out
    with client(s, keys, "admin") as adm:
        assert adm.status()["auth"]["lmcache_connections_refused"] >= 1
    assert "refused an LMCache connection from uid 65534" in s.read_log()

    def another():  # a second server on the same socket path
        return subprocess.run([BIN, "server", "--no-l2", "--port", str(free_port()),
                               "--http-port", "0", "--auth-key", keys["server"][0],
                               "--auth-clients", str(tmp_path / "clients")] + extra,
                              capture_output=True, text=True, timeout=30)

    def served():
        c = RawLmc("ipc://" + sock)
        try:
            assert c.call(LMC_CHUNK_SIZE) == (LMC_CHUNK_SIZE, 256)
        finally:
            c.close()
    # a second server on the same socket path: refused, the first one keeps it
    r = another()
    assert r.returncode != 0 and "another process listens there" in r.stderr, r.stderr
    served()
    # SIGKILL leaves the socket; the next server replaces it
    s.kill()
    assert os.path.exists(sock)
    s.start()
    assert "removed the stale socket" in s.read_log()
    served()
    # a path that is not a socket is never replaced
    s.stop()
    with open(sock, "w") as f:
        f.write("precious")
    r = another()
    assert r.returncode != 0 and "is not a socket" in r.stderr, r.stderr
    assert open(sock).read() == "precious"
