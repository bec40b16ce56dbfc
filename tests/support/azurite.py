"""Azurite, Microsoft's Azure Storage emulator (npm, azurite/), on a free
loopback port with an account of its own, for the tests and benchmarks;
azure_json() is the nixl_store AZURE_BLOB spec for it."""

import base64
import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from support.paths import ROOT
from support.ports import free_port
from support.server import start_on_free_port

NODE = shutil.which("node")
MODULES = os.environ.get("KVT_AZURITE_MODULES", os.path.join(ROOT, "build", "azurite", "node_modules"))
ACCOUNT = "kvtieracct"
KEY = base64.b64encode(hashlib.sha256(b"kvtier azurite test key").digest() * 2).decode()
CONTAINER = "kv-cache"
VERSION = "2021-08-06"


def ensure_modules():
    if os.path.isfile(os.path.join(MODULES, "azurite", "package.json")):
        return
    npm = shutil.which("npm")
    if not npm:
        pytest.fail("node is installed but npm is not: cannot install Azurite")
    d = os.path.dirname(MODULES)
    os.makedirs(d, exist_ok=True)
    for f in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(ROOT, "tests", "support", "azurite", f), d)
    r = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=d,
                       capture_output=True, text=True, timeout=900)
    if r.returncode:
        pytest.fail("npm ci of Azurite failed:\n" + r.stderr)


def shared_key(method, path, query, headers, key=KEY):
    """Authorization header value for a bodiless request (Shared Key)."""
    xms = "".join("%s:%s\n" % (k, headers[k]) for k in sorted(headers) if k.startswith("x-ms-"))
    res = "/%s%s" % (ACCOUNT, path)
    for k in sorted(query):
        res += "\n%s:%s" % (k, query[k])
    sts = "%s\n\n\n\n\n\n\n\n\n\n\n\n%s%s" % (method, xms, res)
    sig = base64.b64encode(hmac.new(base64.b64decode(key), sts.encode(), hashlib.sha256).digest())
    return "SharedKey %s:%s" % (ACCOUNT, sig.decode())


class Azurite:
    def __init__(self, workdir):
        self.dir = str(workdir)
        self.port = free_port()
        self.proc = None

    def start(self):
        ensure_modules()
        exe = os.path.join(MODULES, ".bin", "azurite-blob")

        def launch():
            self.log = open(os.path.join(self.dir, "..", "azurite-%d.log" % self.port), "ab")
            self.proc = subprocess.Popen(
                [exe, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", self.dir,
                 "--silent", "--skipApiVersionCheck"],
                stdout=self.log, stderr=self.log, env=dict(os.environ, AZURITE_ACCOUNTS="%s:%s" % (ACCOUNT, KEY)))
            deadline = time.time() + 60
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    self.log.close()
                    return False
                try:
                    self.request("GET", "", {"comp": "list"})
                    return True
                except OSError:
                    time.sleep(0.1)
            raise RuntimeError("Azurite did not answer on %d within 60 s" % self.port)

        def new_port():
            self.port = free_port()
        return start_on_free_port(self, launch, new_port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    @property
    def account_url(self):
        return "http://127.0.0.1:%d/%s" % (self.port, ACCOUNT)

    def request(self, method, rel, query=None, key=KEY):
        """A signed bodiless request on /<account>/<rel>; returns (status, body)."""
        path = "/%s/%s" % (ACCOUNT, rel) if rel else "/%s/" % ACCOUNT
        query = query or {}
        h = {"x-ms-date": datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT"),
             "x-ms-version": VERSION}
        path = urllib.parse.quote(path)
        h["Authorization"] = shared_key(method, path, query, h, key)
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        if query:
            url += "?" + urllib.parse.urlencode(query)
        req = urllib.request.Request(url, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def create_container(self, name=CONTAINER):
        st, body = self.request("PUT", name, {"restype": "container"})
        assert st in (201, 409), (st, body)

    def blobs(self, prefix=""):
        st, body = self.request("GET", CONTAINER, {"restype": "container", "comp": "list", "prefix": prefix})
        assert st == 200, (st, body)
        return sorted(re.findall(r"<Name>([^<]*)</Name>", body.decode()))


def azure_json(srv, **params):
    bp = {"account_url": srv.account_url, "container_name": CONTAINER}
    bp.update(params)
    return json.dumps({"type": "nixl_store", "backend": "AZURE_BLOB", "backend_params": bp, "pool_size": 32})
