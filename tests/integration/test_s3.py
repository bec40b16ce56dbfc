"""s3 adapter against a real S3-compatible server started by the tests on a
free loopback port: s3rver (npm) behind AWS's own SigV4 signer, which
refuses a wrongly signed request as AWS does (tests/support/s3server).
Large objects, concurrent transfers, wrong credentials, the circuit breaker
opening and closing, config forms and errors. Also the mooncake_store
refusal (no Mooncake client in this build). The contract it shares with
resp (round trip and restart, two servers sharing, the cap after a
restart, a corrupt object, persist_enabled: false) is in
test_remote_contract.py."""

import json
import os
import signal
import subprocess
import time

import pytest

from support.data import adapter_json, keys_for, random_payloads
from support.paths import ROOT
from support.ports import free_port
from support.s3_servers import KEY, S3_KINDS, SECRET, VersityGw, s3_json, start_s3
from support.server import l2_status, run_kvtier, wait_for

KiB = 1 << 10
MiB = 1 << 20
HDR = 512


@pytest.fixture(params=S3_KINDS)
def s3(request, tmp_path):
    srv = start_s3(request.param, tmp_path)
    yield srv
    srv.kill()


def test_large_objects(make_server, s3):
    s = make_server(["--l1-size-gb", "0.75", "--l1-init-size-gb", "0.75",
                     "--l2-store-policy", "skip_l1", "--l2-adapter", s3_json(s3)])
    keys = keys_for("big", 2)
    pay = random_payloads(2, 64 * MiB, seed=2)
    with s.client(shm=False) as c:
        assert c.store(keys, pay) == 2
        c.flush()
        assert c.lookup(keys) == 2
        got = c.retrieve(keys)
    assert [len(g) for g in got] == [64 * MiB] * 2 and got == pay
    a = l2_status(s)
    assert a["counters"]["load_ok"] == 2 and a["counters"]["bytes_read"] == 2 * (HDR + 64 * MiB)
    # header + 64 MiB is above the default 64 MiB threshold: 16 MiB parts
    assert a["multipart"]["completed"] == 2 and a["requests"]["mpu_part"] == 2 * 5


def check_multipart(make_server, spec_json, srv_objects):
    """Objects above s3_multipart_threshold_mb go up in parts (the last one
    short), below it in one PUT; lookups by HEAD after a restart see the
    metadata given at CreateMultipartUpload; the bytes round-trip."""
    s = make_server(["--l1-size-gb", "0.25", "--l1-init-size-gb", "0.25",
                     "--l2-store-policy", "skip_l1", "--l2-adapter", spec_json])
    sizes = [22 * MiB, 8 * MiB - HDR, 10 * MiB + 1]  # 5 parts, one PUT, 3 parts
    keys = keys_for("mpu", 3)
    pay = [p[:n] for p, n in zip(random_payloads(3, 22 * MiB, seed=9), sizes)]
    with s.client(shm=False) as c:
        assert c.store(keys, pay) == 3
        c.flush()
    a = l2_status(s)
    rq = a["requests"]
    assert (rq["put"], rq["mpu_create"], rq["mpu_part"], rq["mpu_complete"], rq["mpu_abort"]) == \
        (1, 2, 8, 2, 0), rq
    assert a["multipart"] == {"threshold_bytes": 8 * MiB, "part_bytes": 5 * MiB, "completed": 2,
                              "failed": 0, "stale_aborted": 0}
    assert a["used_bytes"] == sum(HDR + n for n in sizes) and a["failed_requests"] == 0
    assert len(srv_objects()) == 3
    s.kill(signal.SIGKILL)
    s.start()
    b = s.wait_recovered()["l2"][0]
    assert b["recovery"]["objects"] == 3 and b["used_bytes"] == a["used_bytes"]
    with s.client(shm=False) as c:
        assert c.lookup(keys) == 3
        assert c.retrieve(keys) == pay
    assert l2_status(s)["requests"]["head"] == 3


class FailingProxy:
    """An HTTP/1.1 forwarder in front of an S3 server that answers chosen
    requests itself with 500 InternalError (the body read and dropped) and
    passes every other request through unchanged, Host header included, so
    SigV4 signatures stay valid. fail(method, query) decides per request."""

    def __init__(self, upstream_port, fail):
        import http.client
        import http.server
        up, decide = upstream_port, fail
        self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def handle_one(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                q = self.path.partition("?")[2]
                proxy.seen.append((self.command, q))
                if decide(self.command, q):
                    err = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                c = http.client.HTTPConnection("127.0.0.1", up, timeout=60)
                c.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    c.putheader(k, v)
                c.endheaders(body)
                r = c.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        proxy = self
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        import threading
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_multipart_failed_part_aborts_the_upload(make_server, tmp_path):
    """A part the server fails: the store fails (counted), no object appears,
    the upload is aborted so the server drops the parts already sent, and
    the next store of the same key succeeds."""
    srv = start_s3("versitygw", tmp_path)
    state = {"fail": True}
    px = FailingProxy(srv.port, lambda m, q: state["fail"] and m == "PUT" and "partNumber=3&" in q)
    try:
        spec = json.loads(s3_json(srv, s3_multipart_threshold_mb=8, s3_multipart_part_mb=5))
        spec["s3_endpoint"] = "127.0.0.1:%d" % px.port
        s = make_server(["--l1-size-gb", "0.25", "--l1-init-size-gb", "0.25",
                         "--l2-store-policy", "skip_l1", "--l2-adapter", json.dumps(spec)])
        s.wait_recovered()
        keys = keys_for("mpu-fail", 1)
        pay = random_payloads(1, 22 * MiB, seed=5)
        with s.client(shm=False) as c:
            assert c.store(keys, pay) == 1  # L1 takes it; the L2 store fails
            c.flush()
        a = wait_for(lambda: (lambda x: x if x["requests"]["mpu_abort"] else None)(l2_status(s)),
                     what="the abort")
        assert a["counters"]["store_failed"] == 1 and a["counters"]["store_ok"] == 0
        assert a["multipart"]["failed"] == 1 and a["multipart"]["completed"] == 0
        assert a["requests"]["mpu_complete"] == 0 and a["used_bytes"] == 0
        assert srv.objects("t/") == []
        # the counter goes up when the abort is sent: it may reach the proxy a
        # moment later (seen once under ASan)
        aborts = wait_for(lambda: [q for m, q in px.seen if m == "DELETE" and "uploadId=" in q],
                          what="the abort at the S3 server")
        assert len(aborts) == 1
        # the other four parts reached versitygw (its staging held them)
        assert sum(1 for m, q in px.seen if m == "PUT" and "partNumber=" in q) == 5
        staging = os.path.join(srv.dir, srv.bucket, ".sgwtmp", "multipart")
        wait_for(lambda: not any(files for _, _, files in os.walk(staging)),
                 what="versitygw to drop the aborted upload's parts")
        state["fail"] = False
        with s.client(shm=False) as c:
            c.delete(keys)  # from L1 too, so the next store goes to L2 again
            assert c.store(keys, pay) == 1
            c.flush()
            assert l2_status(s)["multipart"]["completed"] == 1
            assert c.retrieve(keys) == pay
        assert len(srv.objects("t/")) == 1
    finally:
        px.close()
        srv.kill()


def test_stale_uploads_are_aborted_at_start(make_server, tmp_path):
    """An upload that neither completed nor was aborted (here: the part and
    the abort both fail) stays on the server; a server started later lists
    the uploads under its prefix and aborts those older than
    s3_stale_upload_hours, leaving younger ones (another server's) alone."""
    srv = start_s3("versitygw", tmp_path)
    px = FailingProxy(srv.port, lambda m, q: (m == "PUT" and "partNumber=3&" in q) or
                      (m == "DELETE" and "uploadId=" in q))
    staging = os.path.join(srv.dir, srv.bucket, ".sgwtmp", "multipart")

    def staged():
        return sum(len(files) for _, _, files in os.walk(staging))
    try:
        spec = json.loads(s3_json(srv, s3_multipart_threshold_mb=8, s3_multipart_part_mb=5))
        spec["s3_endpoint"] = "127.0.0.1:%d" % px.port
        a = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", json.dumps(spec)])
        a.wait_recovered()
        with a.client(shm=False) as c:
            c.store(keys_for("stale", 1), random_payloads(1, 22 * MiB, seed=6))
            c.flush()
        wait_for(lambda: l2_status(a)["requests"]["mpu_abort"] == 1, what="the failed abort")
        a.kill(signal.SIGKILL)
        assert staged() >= 4  # parts 1, 2, 4, 5 stay on the server
        young = make_server(["--l2-adapter", s3_json(srv)])  # default: 24 h
        b = young.wait_recovered()["l2"][0]
        time.sleep(1.0)
        assert l2_status(young)["multipart"]["stale_aborted"] == 0 and staged() >= 4
        assert l2_status(young)["requests"]["mpu_list"] == 1
        old = make_server(["--l2-adapter", s3_json(srv, s3_stale_upload_hours=0.0002)])  # 0.72 s
        wait_for(lambda: l2_status(old)["multipart"]["stale_aborted"] == 1, what="the sweep")
        wait_for(lambda: staged() == 0, what="versitygw to drop the stale parts")
        assert b["is_healthy"]
    finally:
        px.close()
        srv.kill()


def test_virtual_hosted_addressing(make_server, tmp_path):
    """The LMCache endpoint form "<bucket>.<host>:<port>": the bucket in the
    Host header (libcurl resolves *.localhost to loopback), checked by a
    server that routes on it (versitygw --virtual-domain localhost), with
    multipart uploads, listing after a restart and lookups by HEAD."""
    srv = start_s3("versitygw", tmp_path)
    try:
        spec = json.loads(s3_json(srv, s3_multipart_threshold_mb=8, s3_multipart_part_mb=5))
        for k in ("s3_bucket", "s3_addressing"):
            del spec[k]
        spec["s3_endpoint"] = "%s.localhost:%d" % (srv.bucket, srv.port)
        r = s3_dry(spec)
        a = json.loads(r.stdout)["l2_adapters"][0]
        assert (a["s3_addressing"], a["s3_bucket"]) == ("virtual", srv.bucket), a
        assert a["endpoint_url"] == "http://%s.localhost:%d/" % (srv.bucket, srv.port)
        check_multipart(make_server, json.dumps(spec), lambda: srv.objects("t/"))
    finally:
        srv.kill()


def test_multipart_upload(make_server, s3):
    check_multipart(make_server, s3_json(s3, s3_multipart_threshold_mb=8, s3_multipart_part_mb=5),
                    lambda: s3.objects("t/"))


def test_concurrent_transfers(make_server, s3):
    s = make_server(["--l2-adapter", s3_json(s3, s3_num_io_threads=8)])
    keys = keys_for("many", 48)
    pay = random_payloads(48, 128 * KiB, seed=3)
    with s.client() as c:
        assert c.store(keys, pay) == 48
        c.flush()
    a = l2_status(s)
    assert a["counters"]["store_ok"] == 48 and len(s3.objects("t/")) == 48
    assert 1 < a["peak_transfers"] <= 8, a["peak_transfers"]
    s2 = make_server(["--l2-adapter", s3_json(s3, s3_num_io_threads=8)])
    s2.wait_recovered()
    with s2.client() as c:
        assert c.lookup(keys) == 48
        assert c.retrieve(keys) == pay


@pytest.mark.parametrize("key,secret,code", [(KEY, "not-the-secret", "SignatureDoesNotMatch"),
                                             ("nobody", SECRET, "InvalidAccessKeyId")])
def test_wrong_credentials_are_a_clear_error(make_server, s3, key, secret, code):
    http = 403
    if code == "InvalidAccessKeyId" and isinstance(s3, VersityGw):
        code, http = "XAdminUserNotFound", 404  # versitygw's answer to an unknown key
    s = make_server(["--l2-adapter", s3_json(s3, aws_access_key_id=key, aws_secret_access_key=secret)])
    a = wait_for(lambda: (lambda x: x if not x["is_healthy"] else None)(l2_status(s)),
                 what="the start-up listing to be refused", timeout=30)
    assert a["s3_error"]["code"] == code and a["s3_error"]["http_status"] == http
    assert code in a["health"]
    code_h, body = s.http_get("/healthz")
    assert code_h == 503 and code in body, body
    with s.client() as c:
        assert c.store(keys_for("cred", 3), random_payloads(3, 4096)) == 3  # L1 takes them
        c.flush()
    a = l2_status(s)
    assert a["counters"]["store_failed"] == 3 and a["counters"]["store_ok"] == 0
    assert s3.objects() == []
    assert ("S3 refused" in s.read_log()) and code in s.read_log()


def test_breaker_opens_and_closes(make_server, s3, tmp_path):
    """S3 stopped mid-run: consecutive connection errors open the breaker
    (unhealthy, lookups miss: fs serves, stores fail fast); S3 back: a probe
    closes it again and stores land."""
    fsdir = tmp_path / "fs"
    s = make_server(["--l2-store-policy", "skip_l1",
                     "--l2-adapter", s3_json(s3, connection_timeout=2),
                     "--l2-adapter", adapter_json(type="fs", base_path=str(fsdir))])
    keys = keys_for("brk", 4)
    pay = random_payloads(4, 32 * KiB, seed=4)
    with s.client() as c:
        assert c.store(keys, pay) == 4
        c.flush()
    assert l2_status(s)["counters"]["store_ok"] == 4
    s3.kill()
    with s.client() as c:
        c.store(keys_for("brk2", 4), random_payloads(4, 32 * KiB, seed=5))
        c.flush()
    a = wait_for(lambda: (lambda x: x if x["circuit_breaker"]["state"] != "closed" else None)(l2_status(s)),
                 what="the breaker to open", timeout=30)
    assert a["circuit_breaker"]["opens"] == 1 and not a["is_healthy"]
    assert "circuit open" in a["health"]
    code, body = s.http_get("/healthz")
    assert code == 503 and "s3[0]" in body and "circuit open" in body
    with s.client() as c:
        lookups0 = c.status()["l2"][0]["counters"]["lookup_hits"]
        assert c.lookup(keys) == 4  # served by fs
        assert c.retrieve(keys) == pay
        failed0 = c.status()["l2"][0]["counters"]["store_failed"]
        c.store(keys_for("brk3", 2), random_payloads(2, 1000, seed=6))
        c.flush()
        st = c.status()["l2"]
    assert st[0]["counters"]["lookup_hits"] == lookups0  # breaker open: s3 missed
    assert st[0]["counters"]["store_failed"] - failed0 == 2
    assert st[1]["counters"]["store_ok"] == 10

    s3.start()  # same port, same data
    a = wait_for(lambda: (lambda x: x if x["circuit_breaker"]["state"] == "closed" else None)(l2_status(s)),
                 what="the breaker to close", timeout=30)
    assert a["is_healthy"] and a["requests"]["probe"] >= 1
    assert s.http_get("/healthz")[0] == 200
    last = keys_for("brk4", 2)
    with s.client() as c:
        assert c.store(last, random_payloads(2, 1000, seed=7)) == 2
        c.flush()
    assert l2_status(s)["counters"]["store_ok"] == 6
    assert "circuit closed" in s.read_log()


def test_credentials_from_environment_and_file(make_server, s3, tmp_path):
    spec = json.loads(s3_json(s3))
    del spec["aws_access_key_id"], spec["aws_secret_access_key"]
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["HOME"] = str(home)
    r = subprocess.run([os.environ.get("KVTIER_BIN", os.path.join(ROOT, "build", "kvtier")),
                        "server", "--port", str(free_port()), "--http-port", "0",
                        "--l2-adapter", json.dumps(spec)], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode != 0 and "no AWS credentials" in r.stderr, r.stderr
    s = make_server(["--l2-adapter", json.dumps(spec)],
                    env={"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET})
    assert l2_status(s)["credentials"] == "environment"
    (home / ".aws" / "credentials").write_text(
        "[other]\naws_access_key_id = x\naws_secret_access_key = y\n"
        "[ci]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (KEY, SECRET))
    env = {"HOME": str(home), "AWS_PROFILE": "ci", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    s2 = make_server(["--l2-adapter", json.dumps(spec)], env=env)
    a = l2_status(s2)
    assert a["credentials"].startswith("file ") and "[ci]" in a["credentials"]
    with s2.client() as c:
        c.store(keys_for("fromfile", 2), random_payloads(2, 1000))
        c.flush()
    assert l2_status(s2)["counters"]["store_ok"] == 2


NIXL_OBJ_SEED = '{"type": "nixl_store", "backend": "OBJ", "backend_params": {}, "pool_size": 32}'


def nixl_obj_round_trip(make_server, srv, spec, env):
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec], env=env)
    keys = keys_for("nixl-obj", 6)
    pay = random_payloads(6, 200 * KiB, seed=21)
    with s.client() as c:
        assert c.store(keys, pay) == 6
        c.flush()
    a = l2_status(s)
    assert a["type"] == "nixl_store" and a["is_healthy"], a
    assert a["endpoint_url"] == "http://127.0.0.1:%d/%s/" % (srv.port, srv.bucket)
    assert a["counters"]["store_ok"] == 6 and a["max_transfers"] == 32
    assert len(srv.objects()) == 6
    s.kill(signal.SIGKILL)
    s.start()
    assert s.wait_recovered()["l2"][0]["recovery"]["objects"] == 6
    with s.client() as c:
        assert c.lookup(keys) == 6
        assert c.retrieve(keys) == pay


def test_nixl_obj_seed_example_as_written(make_server, s3):
    """The seed's OBJ example, unchanged: NIXL's S3 plugin takes the bucket,
    credentials and endpoint from the AWS SDK's environment variables; the
    s3 engine serves it."""
    env = {"AWS_DEFAULT_BUCKET": s3.bucket, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_ENDPOINT_URL": "http://127.0.0.1:%d" % s3.port}
    nixl_obj_round_trip(make_server, s3, NIXL_OBJ_SEED, env)


def test_nixl_obj_with_nixl_keys(make_server, s3):
    """NIXL's backend_params names, as its OBJ plugin documents them."""
    spec = {"type": "nixl_store", "backend": "OBJ", "pool_size": 32,
            "backend_params": {"access_key": KEY, "secret_key": SECRET, "bucket": s3.bucket,
                               "endpoint_override": "127.0.0.1:%d" % s3.port, "scheme": "http",
                               "region": "us-east-1", "use_virtual_addressing": "false",
                               "req_checksum": "supported"}}
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec))
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout and '"secret_key": "<set>"' in r.stdout
    nixl_obj_round_trip(make_server, s3, json.dumps(spec), {"AWS_ENDPOINT_URL": "http://wrong:1"})


NIXL_OBJ_BAD = [
    ({}, {}, '"backend_params.bucket" is required (or AWS_DEFAULT_BUCKET'),
    ({"bucket": "b1", "create_bucket": "true"}, {}, '"backend_params.create_bucket" "true" is not supported'),
    ({"bucket": "b1", "access_key": "k"}, {}, '"backend_params.secret_key" is required with access_key'),
    ({"bucket": "b1", "endpoint_override": "ftp://h:1"}, {}, '"backend_params.endpoint_override" must be'),
    ({"bucket": "b1", "endpoint_override": "http://h:1/path"}, {}, '"backend_params.endpoint_override" must be'),
    ({"bucket": "b1", "scheme": "gopher"}, {}, '"backend_params.scheme" must be one of http, https'),
    ({"bucket": "no/slash"}, {}, '"backend_params.bucket" must be a bucket name'),
    ({"bucket": "b1", "file_path": "/x"}, {}, '"backend_params.file_path" is not a known field'),
    ({}, {"AWS_DEFAULT_BUCKET": "b1", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
          "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}, "no AWS credentials"),
]


@pytest.mark.parametrize("params,env,msg", NIXL_OBJ_BAD)
def test_nixl_obj_config_errors(params, env, msg):
    spec = {"type": "nixl_store", "backend": "OBJ", "backend_params": params, "pool_size": 32}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    clean.update(env)
    r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec), env=clean)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def s3_dry(spec):
    return run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter", json.dumps(spec))


S3_FORMS = [
    ({"type": "s3", "s3_endpoint": "s3://my-bucket", "s3_region": "us-west-2"},
     "https://my-bucket.s3.us-west-2.amazonaws.com/", "my-bucket", "virtual"),
    ({"type": "s3", "s3_endpoint": "s3://my-bucket", "s3_region": "us-west-2",
      "s3_prefer_http2": False, "aws_access_key_id": "AKIA", "aws_secret_access_key": "abc"},
     "https://my-bucket.s3.us-west-2.amazonaws.com/", "my-bucket", "virtual"),
    ({"type": "s3", "s3_endpoint": "minio.local:9000", "s3_region": "us-east-1",
      "disable_tls": True, "aws_access_key_id": "minio", "aws_secret_access_key": "minio123"},
     "http://minio.local:9000/", "minio", "virtual"),
    ({"type": "s3", "s3_endpoint": "127.0.0.1:9000", "s3_bucket": "kv", "s3_addressing": "path",
      "s3_region": "us-east-1", "disable_tls": True},
     "http://127.0.0.1:9000/kv/", "kv", "path"),
    ({"type": "s3", "s3_endpoint": "https://s3.eu-west-1.amazonaws.com", "s3_bucket": "b-1",
      "s3_region": "eu-west-1"},
     "https://b-1.s3.eu-west-1.amazonaws.com/", "b-1", "virtual"),
]


@pytest.mark.parametrize("spec,url,bucket,addr", S3_FORMS)
def test_config_forms(spec, url, bucket, addr):
    r = s3_dry(spec)
    assert r.returncode == 0, (spec, r.stderr)
    a = json.loads(r.stdout)["l2_adapters"][0]
    assert (a["endpoint_url"], a["s3_bucket"], a["s3_addressing"]) == (url, bucket, addr), a
    assert a["s3_num_io_threads"] == 64 and a["s3_enable_s3express"] is False
    if "aws_secret_access_key" in spec:
        assert a["aws_secret_access_key"] == "<set>" and spec["aws_secret_access_key"] not in r.stdout


S3_BASE = {"type": "s3", "s3_endpoint": "127.0.0.1:9000", "s3_bucket": "kv", "s3_region": "us-east-1"}
S3_BAD = [
    ({"type": "s3", "s3_endpoint": "s3://b"}, '"s3_region" is required'),
    ({"type": "s3", "s3_region": "us-east-1"}, '"s3_endpoint" is required'),
    (dict(S3_BASE, s3_enable_s3express=True), '"s3_enable_s3express" is not supported'),
    ({"type": "s3", "s3_endpoint": "localhost:9000", "s3_region": "us-east-1"}, "does not name a bucket"),
    ({"type": "s3", "s3_endpoint": "h.example:9000", "s3_region": "us-east-1", "s3_addressing": "path"},
     '"s3_addressing" "path" needs "s3_bucket"'),
    (dict(S3_BASE, s3_addressing="sideways"), '"s3_addressing" must be one of path, virtual'),
    (dict(S3_BASE, aws_access_key_id="AKIA"), '"aws_secret_access_key" is required with aws_access_key_id'),
    (dict(S3_BASE, s3_num_io_threads=0), '"s3_num_io_threads" must be between'),
    (dict(S3_BASE, key_prefix="a/../b"), '"key_prefix" must not contain'),
    (dict(S3_BASE, s3_endpoint="https://h:9000", disable_tls=True), '"disable_tls" contradicts'),
    (dict(S3_BASE, s3_endpoint="http://h:9000/some/path"), '"s3_endpoint" must be'),
    (dict(S3_BASE, s3_bucket="no/slash"), '"s3_bucket" must be a bucket name'),
    (dict(S3_BASE, s3_prefer_http2="maybe"), '"s3_prefer_http2" must be true or false'),
    (dict(S3_BASE, shoe_size=42), '"shoe_size" is not a known field'),
    (dict(S3_BASE, s3_multipart_part_mb=1), '"s3_multipart_part_mb" must be between 5'),
    (dict(S3_BASE, s3_multipart_threshold_mb="big"), '"s3_multipart_threshold_mb" must be a number'),
]


@pytest.mark.parametrize("spec,msg", S3_BAD)
def test_config_errors(spec, msg):
    r = s3_dry(spec)
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #0 (s3)" in r.stderr and msg in r.stderr, (spec, r.stderr)


def test_mooncake_store_is_refused_clearly():
    """The seed's mooncake_store examples parse, then exit 2: this build has
    no Mooncake client library."""
    seeds = [
        {"type": "mooncake_store", "num_workers": 4, "local_hostname": "node01",
         "metadata_server": "http://localhost:8080/metadata", "master_server_addr": "localhost:50051",
         "protocol": "tcp", "local_buffer_size": "3221225472", "global_segment_size": "3221225472"},
        {"type": "mooncake_store", "per_op_workers": {"lookup": 2, "retrieve": 16, "store": 4},
         "local_hostname": "node01", "metadata_server": "http://localhost:8080/metadata",
         "master_server_addr": "localhost:50051", "protocol": "tcp"},
    ]
    for spec in seeds:
        r = run_kvtier("server", "--dry-run", "--l2-adapter", json.dumps(spec))
        assert r.returncode == 2, r.stderr
        assert "--l2-adapter #0 (mooncake_store)" in r.stderr and "Mooncake" in r.stderr, r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps({"type": "mooncake_store", "num_workers": 0}))
    assert r.returncode == 2 and '"num_workers" must be between' in r.stderr, r.stderr
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   json.dumps({"type": "mooncake_store", "per_op_workers": {"compact": 2}}))
    assert r.returncode == 2 and '"per_op_workers.compact" is not a known field' in r.stderr, r.stderr
    assert "lookup, retrieve, store, delete" in r.stderr, r.stderr


def test_delete_removes_objects(make_server, s3):
    """One delete of many keys: its DELETEs go out together (s3_num_io_threads
    at a time), and each key is accounted for."""
    s = make_server(["--l2-adapter", s3_json(s3, s3_num_io_threads=8)])
    keys = keys_for("del", 40)
    pay = random_payloads(40, 10 * KiB, seed=12)
    s.wait_recovered()  # the start-up listing done: it cannot overlap a PUT
    with s.client() as c:
        # nor can the stale-upload sweep that follows the listing (one
        # ListMultipartUploads; s3rver answers 501)
        wait_for(lambda: (lambda a: a["requests"]["mpu_list"] >= 1 and a["active_transfers"] == 0)(
            c.status()["l2"][0]), what="the start-up sweep of stale uploads")
        for i in range(40):  # one PUT at a time
            assert c.store(keys[i:i + 1], pay[i:i + 1]) == 1
            c.flush()
        assert c.status()["l2"][0]["peak_transfers"] == 1
        assert c.delete(keys[:37]) == 37
        a = c.status()["l2"][0]
    assert len(s3.objects("t/")) == 3
    assert a["objects"] == 3 and a["requests"]["delete"] == 37
    assert a["used_bytes"] == 3 * (HDR + 10 * KiB)
    assert 1 < a["peak_transfers"] <= 8  # the DELETEs overlapped, within the limit


def test_serde_over_s3(make_server, s3):
    """lz4 in front of the s3 engine: objects are smaller than the chunks,
    a restart recovers them from the listing, and the bytes come back."""
    s = make_server(["--l2-adapter", s3_json(s3, serde={"type": "lz4"})])
    keys = keys_for("serde-s3", 4)
    # 64 KiB each, compressible, and each its own: a key served another
    # key's object would show
    pay = [bytes((b * (i + 3)) % 251 for b in range(256)) * 256 for i in range(4)]
    assert len(set(pay)) == 4
    with s.client() as c:
        assert c.store(keys, pay) == 4
        c.flush()
    sizes = [os.path.getsize(s3.object_file(o)) for o in s3.objects("t/")]
    assert len(sizes) == 4 and all(HDR < n < 64 * KiB for n in sizes)
    s.kill()
    s.start()
    a = s.wait_recovered()["l2"][0]
    assert a["recovery"]["objects"] == 4 and a["objects"] == 4
    assert a["used_bytes"] == sum(sizes)
    with s.client() as c:
        assert c.lookup(keys) == 4
        assert c.retrieve(keys) == pay
