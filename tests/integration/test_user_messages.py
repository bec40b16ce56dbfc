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

from conftest import BIN, ROOT, keys_for, random_payloads, run_kvtier

README_PATH = os.path.join(ROOT, "README.md")



def test_start_lines_name_sizes_and_adapter_paths(make_server, tmp_path):
    nd = tmp_path / "nd"
    rb = tmp_path / "rb.img"
    with open(rb, "wb") as f:
        f.truncate(64 << 20)  # zeros: a fresh device
    s = make_server(["--l1-size-gb", "1000", "--no-local-socket",
                     "--l2-adapter", json.dumps({"type": "nixl_store_dynamic", "backend": "POSIX",
                                                 "backend_params": {"file_path": str(nd),
                                                                    "max_capacity_gb": 1}}),
                     "--l2-adapter", json.dumps({"type": "raw_block", "device_path": str(rb),
                                                 "slot_bytes": 65536,
                                                 "meta_total_bytes": 4 << 20})])
    log = s.read_log()
    assert "L1: 1000.00 GiB shared memory (lazy" in log, log  # not "1e+03 GiB"
    assert "L2 #0: nixl_store_dynamic at %s\n" % nd in log, log
    assert "L2 #1: raw_block at %s\n" % rb in log, log


def test_http_start_has_nothing_to_warn_about(make_server, tmp_path):
    """libmicrohttpd warned at every start, at debug level, that its logger
    was not its first option."""
    s = make_server(["--log-level", "debug", "--no-l2"])
    assert s.http_get("/healthz")[0] == 200
    assert "libmicrohttpd" not in s.read_log(), s.read_log()
