"""The KV-events flags (docs/events.md): a bad value exits 2 naming the
flag, an address beyond loopback needs --insecure-no-auth, --dry-run shows
the resolved values, and an address in use fails the start before any
adapter opened. (The events themselves are tested with vLLM's decoder in
tests/vllm/test_kv_events.py.)"""

import json
import socket

import pytest

from support.ports import free_port
from support.server import run_kvtier

BAD = [
    (["--kv-events-replay-endpoint", "tcp://127.0.0.1:5558"], "--kv-events-replay-endpoint: needs"),
    (["--kv-events-endpoint", "http://127.0.0.1:5557"], "--kv-events-endpoint: expected tcp://"),
    (["--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-replay-endpoint", "udp://x"],
     "--kv-events-replay-endpoint: expected tcp://"),
    (["--kv-events-endpoint", "tcp://0.0.0.0:5557"], "--kv-events-endpoint: tcp://0.0.0.0:5557 is reachable"),
    (["--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-replay-endpoint",
      "tcp://127.0.0.1:5557"], "--kv-events-replay-endpoint: the same address"),
    (["--kv-events-buffer", "0"], "--kv-events-buffer: 0 is out of range"),
    (["--kv-events-queue", "-1"], "--kv-events-queue:"),
    (["--kv-events-hwm", "x"], "--kv-events-hwm:"),
]


@pytest.mark.parametrize("args,msg", BAD)
def test_bad_flag_exits_2_naming_it(args, msg, tmp_path):
    r = run_kvtier("server", "--dry-run", "--data-dir", str(tmp_path), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert msg in r.stderr


def test_beyond_loopback_with_insecure_no_auth_and_dry_run(tmp_path):
    r = run_kvtier("server", "--dry-run", "--data-dir", str(tmp_path), "--insecure-no-auth",
                   "--kv-events-endpoint", "tcp://0.0.0.0:5557", "--kv-events-topic", "kv@a@m",
                   "--kv-events-buffer", "7")
    assert r.returncode == 0, r.stderr
    ev = json.loads(r.stdout[r.stdout.index("{"):])["kv_events"]
    assert ev == {"endpoint": "tcp://0.0.0.0:5557", "replay_endpoint": None, "topic": "kv@a@m",
                  "buffer": 7, "queue": 262144, "hwm": 100000, "wait_subscriber_ms": 10000}


def test_address_in_use_fails_before_storage_opens(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = run_kvtier("server", "--port", str(free_port()), "--http-port", "0", "--data-dir",
                       str(tmp_path / "d"), "--kv-events-endpoint", "tcp://127.0.0.1:%d" % port)
    finally:
        s.close()
    assert r.returncode != 0
    assert "--kv-events-endpoint: cannot listen on tcp://127.0.0.1:%d" % port in r.stdout + r.stderr
    assert not (tmp_path / "d").exists()
