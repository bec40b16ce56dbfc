"""nixl_store "backend": "AZURE_BLOB" against Azurite, Microsoft's Azure
Storage emulator (npm), started by the tests on a free loopback port with an
account of their own: Azurite checks every request's Shared Key signature
and SAS. The seed's example with the account in the environment, a SIGKILL
restart recovered by List Blobs, a SAS instead of the key, a wrong key
refused clearly, a corrupt blob a miss, config errors."""

import base64
import datetime
import hashlib
import hmac
import json
import os
import signal
import urllib.parse
import urllib.request

import pytest

from support.azurite import ACCOUNT, CONTAINER, KEY, NODE, VERSION, Azurite, azure_json
from support.data import keys_for, random_payloads
from support.server import l2_status, run_kvtier, wait_for

KiB = 1 << 10


@pytest.fixture
def azurite(tmp_path):
    if NODE is None:
        pytest.skip("node is not installed: no Azurite")
    d = tmp_path / "azurite"
    d.mkdir()
    srv = Azurite(d).start()
    srv.create_container()
    yield srv
    srv.kill()


SEED = ('{"type": "nixl_store", "backend": "AZURE_BLOB", "backend_params": {"account_url": '
        '"https://<account_name>.blob.core.windows.net", "container_name": "<container_name>"}, "pool_size": 32}')


def round_trip(make_server, srv, spec, env, n=8):
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", spec], env=env)
    keys = keys_for("azure", n)
    pay = random_payloads(n, 150 * KiB, seed=4)
    with s.client() as c:
        assert c.store(keys, pay) == n
        c.flush()
    a = l2_status(s)
    assert a["api"] == "azure_blob" and a["type"] == "nixl_store" and a["is_healthy"], a
    assert a["counters"]["store_ok"] == n and a["failed_requests"] == 0
    assert len(srv.blobs()) == n
    s.kill(signal.SIGKILL)
    s.start()
    b = s.wait_recovered()["l2"][0]
    assert b["recovery"]["objects"] == n and b["used_bytes"] == a["used_bytes"]
    with s.client() as c:
        assert c.lookup(keys) == n
        assert c.retrieve(keys) == pay
    return s, keys, pay


def test_seed_example_with_the_account_in_the_environment(make_server, azurite):
    """The seed's AZURE_BLOB example, its placeholders replaced through NIXL's
    environment fallbacks (an empty backend_params), the key in
    AZURE_STORAGE_KEY: Azurite checks every Shared Key signature."""
    spec = json.loads(SEED)
    spec["backend_params"] = {}
    env = {"AZURE_STORAGE_ACCOUNT_URL": azurite.account_url, "AZURE_STORAGE_CONTAINER_NAME": CONTAINER,
           "AZURE_STORAGE_KEY": KEY}
    s, keys, _ = round_trip(make_server, azurite, json.dumps(spec), env)
    with s.client() as c:
        assert c.delete(keys[:3]) == 3
    assert len(azurite.blobs()) == 5
    assert "AZURE_STORAGE_KEY" in l2_status(s)["credentials"]


def test_sas_token(make_server, azurite):
    """An account SAS instead of the key (signed by the test as Azure's
    account SAS rules say; Azurite verifies it)."""
    expiry = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    sv, ss, srt, sp, spr = VERSION, "b", "sco", "rwdlac", "http,https"
    sts = "\n".join([ACCOUNT, sp, ss, srt, "", expiry, "", spr, sv, ""]) + "\n"
    sig = base64.b64encode(hmac.new(base64.b64decode(KEY), sts.encode(), hashlib.sha256).digest()).decode()
    sas = urllib.parse.urlencode({"sv": sv, "ss": ss, "srt": srt, "sp": sp, "se": expiry, "spr": spr, "sig": sig})
    round_trip(make_server, azurite, azure_json(azurite, sas_token="?" + sas), {}, n=4)
    r = run_kvtier("server", "--dry-run", "--l2-adapter", azure_json(azurite, sas_token=sas))
    assert r.returncode == 0 and sig not in r.stdout and '"sas_token": "<set>"' in r.stdout, r.stdout


def test_wrong_key_is_a_clear_error(make_server, azurite):
    wrong = base64.b64encode(b"\x01" * 64).decode()
    s = make_server(["--l2-adapter", azure_json(azurite, account_key=wrong)])
    a = wait_for(lambda: (lambda x: x if not x["is_healthy"] else None)(l2_status(s)),
                 what="the listing to be refused", timeout=30)
    assert a["s3_error"]["http_status"] == 403, a["s3_error"]
    assert a["s3_error"]["code"] in ("AuthenticationFailed", "AuthorizationFailure"), a["s3_error"]
    with s.client() as c:
        assert c.store(keys_for("wrong", 2), random_payloads(2, 4096)) == 2
        c.flush()
    assert l2_status(s)["counters"]["store_failed"] == 2
    assert azurite.blobs() == []
    assert wrong not in s.read_log()


def test_corrupt_blob_is_a_miss_and_removed(make_server, azurite):
    """A blob rewritten through Azure's own API with one payload byte
    flipped: the prefix is cut there, counted, and the blob deleted."""
    s = make_server(["--l2-store-policy", "skip_l1", "--l2-adapter", azure_json(azurite, account_key=KEY)])
    keys = keys_for("corrupt", 3)
    pay = random_payloads(3, 64 * KiB, seed=8)
    with s.client() as c:
        assert c.store(keys, pay) == 3
        c.flush()
    names = azurite.blobs()
    assert len(names) == 3, (names, l2_status(s))
    name = [b for b in names if keys.hashes[1].hex() in b][0]
    path = urllib.parse.quote("/%s/%s/%s" % (ACCOUNT, CONTAINER, name))
    st, body = azurite.request("GET", "%s/%s" % (CONTAINER, name))
    assert st == 200 and len(body) == 512 + 64 * KiB
    body = bytearray(body)
    body[512 + 1000] ^= 0x40
    h = {"x-ms-date": datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT"),
         "x-ms-version": VERSION, "x-ms-blob-type": "BlockBlob"}
    xms = "".join("%s:%s\n" % (k, h[k]) for k in sorted(h))
    sts = "PUT\n\n\n%d\n\napplication/octet-stream\n\n\n\n\n\n\n%s/%s%s" % (len(body), xms, ACCOUNT, path)
    h["Authorization"] = "SharedKey %s:%s" % (ACCOUNT, base64.b64encode(
        hmac.new(base64.b64decode(KEY), sts.encode(), hashlib.sha256).digest()).decode())
    h["Content-Type"] = "application/octet-stream"
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (azurite.port, path),
                                 data=bytes(body), method="PUT", headers=h)
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 201
    with s.client() as c:
        assert c.retrieve(keys) == pay[:1]
    assert l2_status(s)["counters"]["corrupt"] == 1
    wait_for(lambda: name not in azurite.blobs(), what="the corrupt blob to be deleted", timeout=30)


AZ_BAD = [
    ({}, {}, '"backend_params.account_url" is required (or AZURE_STORAGE_ACCOUNT_URL)'),
    ({"account_url": "https://a.blob.core.windows.net"}, {}, '"backend_params.container_name" is required'),
    ({"account_url": "https://a.blob.core.windows.net", "container_name": "Bad_Name"}, {},
     '"backend_params.container_name" must be 3..63 lower-case'),
    ({"account_url": "ftp://a.blob.core.windows.net", "container_name": "kv-a"}, {}, '"backend_params.account_url" must be'),
    ({"account_url": "https://<account_name>.blob.core.windows.net", "container_name": "kv-a"}, {},
     '"backend_params.account_url" must be'),
    ({"account_url": "https://a.blob.core.windows.net", "container_name": "kv-a", "account_key": "x", "sas_token": "y"},
     {}, '"backend_params.sas_token" and account_key exclude each other'),
    ({"account_url": "https://a.blob.core.windows.net", "container_name": "kv-a", "file_path": "/x"}, {},
     '"backend_params.file_path" is not a known field'),
    ({"account_url": "https://a.blob.core.windows.net", "container_name": "kv-a"}, {"_check": "1"},
     "no Azure credentials"),
]


@pytest.mark.parametrize("params,env,msg", AZ_BAD)
def test_config_errors(params, env, msg):
    spec = {"type": "nixl_store", "backend": "AZURE_BLOB", "backend_params": params, "pool_size": 32}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    args = ["server", "--dry-run"] + ([] if env else ["--no-storage-check"])
    r = run_kvtier(*args, "--l2-adapter", json.dumps(spec), env=clean)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_seed_example_parses_with_its_placeholders_refused_clearly():
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter", SEED)
    assert r.returncode == 2 and "backend_params." in r.stderr and "<container_name>" in r.stderr, r.stderr
