"""S3-compatible servers on free loopback ports, for the tests and
benchmarks: s3rver (npm) behind AWS's own SigV4 signer (s3server/), and
versitygw, a production S3 gateway built by make test-servers;
start_s3() starts either, s3_json() is the s3 adapter's spec for it."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.server import start_on_free_port

NODE = shutil.which("node")
SERVER_JS = os.path.join(ROOT, "tests", "support", "s3server", "server.js")
MODULES = os.environ.get("KVT_S3SERVER_MODULES",
                         os.path.join(ROOT, "build", "s3server", "node_modules"))
KEY, SECRET = "kvtier", "kvtier-secret"


def ensure_modules():
    """The npm packages normally come from scripts/install-test-servers.sh; install
    them here when a checkout skipped that step."""
    if os.path.isfile(os.path.join(MODULES, "s3rver", "package.json")):
        return
    npm = shutil.which("npm")
    if not npm:
        pytest.fail("node is installed but npm is not: cannot install the S3 test server")
    d = os.path.dirname(MODULES)
    os.makedirs(d, exist_ok=True)
    for f in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(ROOT, "tests", "support", "s3server", f), d)
    r = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=d,
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        pytest.fail("npm ci of the S3 test server failed:\n" + r.stderr)


class S3Proc:
    """An S3 server process on a free loopback port, one bucket, data under
    a directory. Subclasses define launch(): start once, True when ready,
    False when it exited (most likely its port was taken)."""

    def __init__(self, workdir, bucket):
        self.dir = str(workdir)
        self.bucket = bucket
        self.port = free_port()
        self.proc = None

    def start(self):
        def new_port():
            self.port = free_port()
        return start_on_free_port(self, self.launch, new_port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    @property
    def endpoint(self):
        return "127.0.0.1:%d" % self.port


class S3Server(S3Proc):
    """s3rver with SigV4 verification."""

    def __init__(self, workdir, bucket="kv"):
        super().__init__(workdir, bucket)

    def start(self):
        ensure_modules()
        return super().start()

    def launch(self):
        env = dict(os.environ, NODE_PATH=MODULES)
        self.log = open(os.path.join(self.dir, "..", "s3server-%d.log" % self.port), "ab")
        self.proc = subprocess.Popen(
            [NODE, SERVER_JS, "--port", str(self.port), "--dir", self.dir, "--bucket", self.bucket,
             "--access-key", KEY, "--secret-key", SECRET],
            stdout=subprocess.PIPE, stderr=self.log, env=env)
        line = self.proc.stdout.readline().decode()
        if line.startswith("ready"):
            return True
        self.proc.wait(timeout=30)
        self.log.close()
        return False  # most likely its port was taken

    def objects(self, prefix=""):
        """Object keys as stored by s3rver (one *._S3rver_object file each)."""
        root = os.path.join(self.dir, self.bucket)
        out = []
        for d, _, files in os.walk(root):
            for f in files:
                if f.endswith("._S3rver_object"):
                    rel = os.path.relpath(os.path.join(d, f), root)
                    out.append(rel[: -len("._S3rver_object")])
        return sorted(k for k in out if k.startswith(prefix))

    def object_file(self, key):
        return os.path.join(self.dir, self.bucket, key + "._S3rver_object")


VERSITYGW = os.environ.get("KVT_VERSITYGW", os.path.join(ROOT, "build", "tools", "bin", "versitygw"))


class VersityGw(S3Proc):
    """versitygw (github.com/versity/versitygw, Apache-2.0): a production S3
    gateway in Go, here on its POSIX backend (a bucket is a directory, an
    object a file, metadata in extended attributes). It verifies SigV4
    itself, enforces AWS's bucket-name and multipart rules (5 MiB parts),
    and serves virtual-hosted addressing under --virtual-domain: a real S3
    server beside s3rver. scripts/install-test-servers.sh builds it from the Go
    module proxy."""

    def __init__(self, workdir, bucket="kvtier-test"):  # AWS bucket rules: 3..63 characters
        super().__init__(workdir, bucket)
        os.makedirs(os.path.join(self.dir, bucket), exist_ok=True)

    def launch(self):
        self.log = open(os.path.join(self.dir, "..", "versitygw-%d.log" % self.port), "ab")
        self.proc = subprocess.Popen(
            [VERSITYGW, "--port", "127.0.0.1:%d" % self.port, "--access", KEY, "--secret", SECRET,
             "--virtual-domain", "localhost", "--quiet", "posix", self.dir],
            stdout=self.log, stderr=self.log, env=dict(os.environ, HOME=self.dir))
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.close()
                return False  # most likely its port was taken
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("versitygw did not listen on %d within 30 s" % self.port)

    def objects(self, prefix=""):
        root = os.path.join(self.dir, self.bucket)
        out = []
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".")]  # its multipart staging
            out += [os.path.relpath(os.path.join(d, f), root) for f in files]
        return sorted(k for k in out if k.startswith(prefix))

    def object_file(self, key):
        return os.path.join(self.dir, self.bucket, key)


def start_s3(kind, tmp_path):
    """One of the two S3 implementations on a free loopback port."""
    if kind == "s3rver" and NODE is None:
        pytest.skip("node is not installed: no s3rver")
    if kind == "versitygw" and not os.access(VERSITYGW, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail("%s is missing: scripts/install-test-servers.sh (make test-servers) builds it" % VERSITYGW)
        pytest.skip("%s is not built (make test-servers builds it)" % VERSITYGW)
    d = tmp_path / ("s3data-" + kind)
    d.mkdir()
    return (S3Server(d) if kind == "s3rver" else VersityGw(d)).start()


S3_KINDS = ["s3rver", "versitygw"]


def s3_json(s3, **kw):
    spec = {"type": "s3", "s3_endpoint": s3.endpoint, "s3_bucket": s3.bucket,
            "s3_addressing": "path", "s3_region": "us-east-1", "disable_tls": True,
            "aws_access_key_id": KEY, "aws_secret_access_key": SECRET, "key_prefix": "t"}
    spec.update(kw)
    return json.dumps(spec)
