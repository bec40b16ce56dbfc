"""kvtier server --lmcache-port: configuration errors exit 2 naming the flag;
the L1 pool is a named POSIX shm object while the server runs, gone after it
stops; a name in use is refused at start-up. (The protocol itself is tested
with LMCache's own client and vLLM in tests/vllm/test_lmcache_dropin.py.)"""

import json
import os
import subprocess
import urllib.request

from support.paths import BIN
from support.ports import free_port


def run(args, timeout=30):
    return subprocess.run([BIN, "server"] + args, capture_output=True, text=True,
                          timeout=timeout)


def test_flag_errors_exit_2_naming_the_flag(tmp_path):
    for args, needle in [
        (["--lmcache-port", "70000"], "--lmcache-port"),
        (["--lmcache-port", "x"], "--lmcache-port"),
        (["--lmcache-port", "5999", "--no-shm"], "--lmcache-port"),
        (["--lmcache-port", "5999", "--l1-use-hugepages"], "--lmcache-port"),
        (["--lmcache-shm-name", "a/b"], "--lmcache-shm-name"),
        (["--lmcache-shm-name", ""], "--lmcache-shm-name"),
        (["--lmcache-host", ""], "--lmcache-host"),
        (["--lmcache-host", "ipc://relative/path"], "--lmcache-host"),
    ]:
        r = run(args + ["--dry-run", "--data-dir", str(tmp_path)])
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr, (args, r.stderr)


def test_dry_run_shows_lmcache_config(tmp_path):
    r = run(["--lmcache-port", "5999", "--lmcache-shm-name", "x1", "--dry-run",
             "--data-dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    assert cfg["lmcache"] == {"port": 5999, "host": "localhost", "shm_name": "lmcache_l1_pool_x1",
                              "client": None}


def test_named_pool_lives_with_the_server_and_a_name_in_use_is_refused(make_server, tmp_path):
    name = "lmcache_l1_pool_kvtier_test_%d" % os.getpid()
    lp = free_port()
    s = make_server(["--lmcache-port", str(lp), "--lmcache-host", "127.0.0.1",
                     "--lmcache-shm-name", name])
    path = "/dev/shm/" + name
    assert os.path.exists(path)
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600
    assert st.st_size >= 0.25 * 2**30  # the whole pool, though lazily backed
    with urllib.request.urlopen("http://127.0.0.1:%d/status" % s.http_port, timeout=5) as r:
        lmc = json.loads(r.read())["lmcache"]
    assert lmc["endpoint"] == "tcp://127.0.0.1:%d" % lp and lmc["shm_name"] == name
    # a second server with the same name: refused, naming it, nothing removed
    r = run(["--port", str(free_port()), "--http-port", "0", "--lmcache-port", str(free_port()),
             "--lmcache-shm-name", name, "--l1-size-gb", "0.1", "--data-dir",
             str(tmp_path / "d2")])
    assert r.returncode != 0 and name in r.stderr, r.stderr
    assert os.path.exists(path)
    s.stop()
    assert not os.path.exists(path)
