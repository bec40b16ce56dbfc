"""What a user reads: the start lines name sizes as sizes and every L2
adapter's path, libmicrohttpd has nothing to warn about at debug level,
purge's progress bar through a server fills, and the README's list of the
seed examples refused as written names each of them."""

import json
import os
import pty
import re
import select
import subprocess

from support.data import adapter_json, keys_for, random_payloads
from support.paths import BIN, ROOT, SANITIZER
from support.server import run_kvtier

MiB = 1 << 20
# ThreadSanitizer keeps applications' mappings in about 1.5 TiB of address
# space (beside its shadow): a 1000 GiB L1 fits there only some of the time
TSAN = SANITIZER == "thread"
README_PATH = os.path.join(ROOT, "README.md")


def test_start_lines_name_sizes_and_adapter_paths(make_server, tmp_path):
    nd = tmp_path / "nd"
    rb = tmp_path / "rb.img"
    with open(rb, "wb") as f:
        f.truncate(64 << 20)  # zeros: a fresh device
    s = make_server(["--l1-size-gb", "1" if TSAN else "1000", "--no-local-socket",
                     "--l2-adapter", json.dumps({"type": "nixl_store_dynamic", "backend": "POSIX",
                                                 "backend_params": {"file_path": str(nd),
                                                                    "max_capacity_gb": 1}}),
                     "--l2-adapter", json.dumps({"type": "raw_block", "device_path": str(rb),
                                                 "slot_bytes": 65536,
                                                 "meta_total_bytes": 4 << 20})])
    log = s.read_log()
    # not "1e+03 GiB" (the plain and AddressSanitizer runs)
    assert "L1: %s GiB shared memory (lazy" % ("1.00" if TSAN else "1000.00") in log, log
    assert "L2 #0: nixl_store_dynamic at %s\n" % nd in log, log
    assert "L2 #1: raw_block at %s\n" % rb in log, log


def test_http_start_has_nothing_to_warn_about(make_server, tmp_path):
    """libmicrohttpd warned at every start, at debug level, that its logger
    was not its first option."""
    s = make_server(["--log-level", "debug", "--no-l2"])
    assert s.http_get("/healthz")[0] == 200
    assert "libmicrohttpd" not in s.read_log(), s.read_log()


def test_purge_progress_bar_through_the_server_fills(make_server, tmp_path):
    root = tmp_path / "kv"
    s = make_server(["--l2-adapter", json.dumps({"type": "fs", "base_path": str(root)})])
    with s.client() as c:
        c.store(keys_for("m", 40), random_payloads(40, 4096))
        c.store(keys_for("other", 3, seed=5), random_payloads(3, 4096))
        c.flush()
    # the bar is drawn on a terminal only: stderr is a pty
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, "purge", "--root", str(root), "--url", s.url, "--namespace=m",
                          "--yes"], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        if not r:
            break
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        err += chunk
    out = p.communicate(timeout=30)[0].decode()
    os.close(master)
    assert p.returncode == 0, err
    assert "40 object file(s)" in out, out
    frames = err.decode(errors="replace").split("\r")
    last = [f for f in frames if f.startswith("purging m [")][-1]
    assert re.match(r"purging m \[#{30}\] 100% 40/40 files", last), frames


def test_readme_lists_every_refused_seed_example(tmp_path):
    """The seed's OBJ example without a bucket is refused as written (exit
    2, naming the key and the variable), and the README's list of refused
    seed examples says so."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_DEFAULT_BUCKET"}
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter",
                   '{"type": "nixl_store", "backend": "OBJ", "backend_params": {}, "pool_size": 32}',
                   env=env)
    assert r.returncode == 2, r.stderr
    assert '"backend_params.bucket" is required (or AWS_DEFAULT_BUCKET' in r.stderr, r.stderr
    text = " ".join(open(README_PATH).read().split())
    m = re.search(r"Every `--l2-adapter` example of the seed documents passes .*? is refused "
                  r"with exit 2 and what to use instead \(([^)]*)\)", text)
    assert m, "the README's sentence about the seed examples is gone"
    listed = m.group(1)
    for what in ("without cuFile", "AZURE_BLOB's placeholders", "OBJ without a bucket"):
        assert what in listed, listed


def test_nixl_store_says_what_it_preallocates(make_server, tmp_path):
    s = make_server(["--l2-adapter", adapter_json(
        type="nixl_store", backend="POSIX", pool_size=3,
        backend_params={"file_path": str(tmp_path / "ns"), "file_size": 2 * MiB})])
    log = s.read_log()
    assert "preallocating 0.01 GiB" in log and "pool_size 3 x file_size 2.00 MiB" in log, log
