"""Description: kvtier as a systemd service: the installed unit passes
`systemd-analyze verify`, and the server speaks the notify protocol
(READY=1 once it listens, WATCHDOG=1 from its rpc loop, STOPPING=1 on
SIGTERM) on a NOTIFY_SOCKET the test listens on.
"""

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

from support.install import needs_build_tree
from support.paths import BIN
from support.ports import free_port
from support.server import Server


def recv_all(sock, until, timeout):
    """Datagrams received until one contains `until` (or the timeout)."""
    got = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        sock.settimeout(max(0.01, deadline - time.time()))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            break
        got.append(msg)
        if until in msg:
            break
    return got


@needs_build_tree
@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed "
                    "(Debian's systemd package)")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    # installed under a private prefix, so ExecStart and --config name files
    # that exist; MANPATH lets verify check the Documentation= man pages
    prefix = tmp_path / "p"
    subprocess.run(["cmake", "--install", os.path.dirname(BIN), "--prefix", str(prefix)],
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, DESTDIR=""))
    unit = prefix / "lib/systemd/system/kvtier.service"
    text = unit.read_text()
    for line in ("Type=notify", "WatchdogSec=", "ProtectSystem=strict",
                 "ReadWritePaths=/var/lib/kvtier", "NoNewPrivileges=true", "PrivateTmp=true",
                 "LimitNOFILE=", "User=kvtier", "RuntimeDirectory=kvtier",
                 "RuntimeDirectoryMode=0700"):
        assert line in text, line
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                       env=dict(os.environ, MANPATH=str(prefix / "share/man")))
    # verify exits 0 on a bad value too ("Failed to parse ..., ignoring"):
    # any output is a finding
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


@pytest.mark.parametrize("abstract", [False, True])
def test_notify_ready_watchdog_stopping(tmp_path, abstract):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = "kvtier-test-notify-%d" % os.getpid()
        sock.bind("\0" + name)
        addr = "@" + name
    else:
        addr = str(tmp_path / "notify.sock")
        sock.bind(addr)
    s = None
    try:
        s = Server([], tmp_path, data_dir=str(tmp_path / "data"),
                   env={"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "200000"})
        s.start(wait=False)
        got = recv_all(sock, "READY=1", 20)
        assert got and "READY=1" in got[-1], (got, s.read_log())
        ready = got[-1].split("\n")
        assert "MAINPID=%d" % s.proc.pid in ready and any(
            m.startswith("STATUS=listening on ") for m in ready), ready
        # ready means listening: the first request is answered at once
        with s.client(timeout_ms=2000) as c:
            c.ping()
            st = c.status()
        assert all("recovery" in a for a in st["l2"])  # recovery scans have started
        # WATCHDOG=1 at half the 0.2 s period, also when no request comes
        got = recv_all(sock, "WATCHDOG=1", 3)
        assert got and got[-1] == "WATCHDOG=1", got
        t0 = time.time()
        n = len(recv_all(sock, "never", 1.0))
        assert n >= 4, "%d watchdog pings in %.1f s" % (n, time.time() - t0)
        s.proc.send_signal(signal.SIGTERM)
        got = recv_all(sock, "STOPPING=1", 20)
        assert got and "STOPPING=1" in got[-1], got
        assert s.proc.wait(timeout=30) == 0
    finally:
        if s and s.proc and s.proc.poll() is None:
            s.kill()
        sock.close()


def test_watchdog_pid_of_another_process_means_no_pings(tmp_path):
    # WATCHDOG_PID naming another process: no watchdog pings from this one
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    addr = str(tmp_path / "n.sock")
    sock.bind(addr)
    s = Server([], tmp_path, data_dir=str(tmp_path / "data"),
               env={"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": "1"})
    try:
        s.start()
        got = recv_all(sock, "never", 1.0)
        assert any("READY=1" in m for m in got), got
        assert not any("WATCHDOG" in m for m in got), got
    finally:
        s.kill()
        sock.close()


def test_json_lines_log(tmp_path):
    """--log-format json (and KVT_LOG_FORMAT=json): every line is one JSON
    object with ts, level and msg; a bad value exits 2 naming the flag or
    the variable."""
    import json
    for args, env in (([ "--log-format", "json"], None), ([], {"KVT_LOG_FORMAT": "json"})):
        s = Server(args, tmp_path, data_dir=str(tmp_path / "data"), env=env)
        s.start()
        with s.client() as c:
            c.ping()
        s.stop()
        lines = s.read_log().splitlines()
        assert len(lines) >= 4, lines
        recs = [json.loads(l) for l in lines]  # all of them, or this raises
        for r in recs:
            assert set(r) == {"ts", "level", "msg"} and r["level"] in ("debug", "info", "warn",
                                                                         "error"), r
            assert r["ts"].endswith("Z")
        assert any(r["msg"].startswith("kvtier ") and "listening on" in r["msg"] for r in recs)
        assert recs[-1]["msg"] == "stopped"
    # an HTTP port in use: libmicrohttpd's own complaint goes through the
    # logger too (it printed a bare "Failed to bind to port" line)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        r = subprocess.run([BIN, "server", "--log-format", "json", "--port", str(free_port()),
                            "--http-port", str(busy.getsockname()[1]), "--data-dir",
                            str(tmp_path / "busy")], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    recs = [json.loads(l) for l in r.stderr.splitlines()]  # all of them, or this raises
    # the bind's own error, not a guess
    assert any("cannot listen on http" in x["msg"] and "Address already in use" in x["msg"]
               for x in recs), recs
    r = subprocess.run([BIN, "server", "--log-format", "yaml", "--dry-run"], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "--log-format" in r.stderr, r.stderr
    r = subprocess.run([BIN, "server", "--dry-run"], capture_output=True, text=True,
                       env=dict(os.environ, KVT_LOG_FORMAT="yaml"))
    assert r.returncode == 2 and "KVT_LOG_FORMAT" in r.stderr, r.stderr


def test_one_port_for_two_listeners_is_refused_naming_the_key(tmp_path):
    """--http-port or --lmcache-port equal to --port (or to each other) on
    hosts that collide: exit 2 naming the key, before anything binds or
    touches the data directory. Different hosts may share a number."""
    p, q = free_port(), free_port()
    data = tmp_path / "data"
    cases = [
        (["--port", str(p), "--http-port", str(p)], "--http-port", "--port"),
        (["--host", "0.0.0.0", "--port", str(p), "--http-port", str(p), "--http-token", "t"],
         "--http-port", "--port"),
        (["--port", str(p), "--http-port", "0", "--lmcache-port", str(p)], "--lmcache-port",
         "--port"),
        (["--port", str(p), "--http-port", str(q), "--lmcache-port", str(q)], "--lmcache-port",
         "--http-port"),
    ]
    for args, key, other in cases:
        r = subprocess.run([BIN, "server", "--data-dir", str(data)] + args, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert "%s: port %d is also %s's" % (key, int(args[args.index(key) + 1]), other) in r.stderr
        assert not data.exists()
    r = subprocess.run([BIN, "server", "--dry-run", "--no-l2", "--port", str(p), "--http-host",
                        "127.0.0.2", "--http-port", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
