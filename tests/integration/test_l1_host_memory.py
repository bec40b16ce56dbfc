"""An L1 larger than the machine: --l1-size-gb is checked against what the
host and its limits give (MemAvailable and MemTotal, the cgroup's memory
limit, /dev/shm for a named pool, RLIMIT_AS, free huge pages) before
anything is created, by the start and by --dry-run alike. A preallocated
pool that does not fit, or a mapping beyond RLIMIT_AS, exits 2 naming the
numbers; a lazy pool above what the host could ever back starts with a
warning shown in the log, /status and `kvtier status`.

No test here allocates a large pool: every request that would allocate
more than the host has runs under an RLIMIT_AS or a memory cgroup smaller
than the request, so a server that did not check would fail to map (or be
killed inside its cgroup), never take the machine's memory.
"""

import json
import os
import resource
import subprocess

import pytest

from support.paths import BIN, SANITIZER
from support.server import run_kvtier

GIB = 2**30


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def gib(n_bytes):
    """A size as kvtier's messages print it (l1/hostmem.c)."""
    g = n_bytes / GIB
    return ("%.3f GiB" if 0 < g < 0.1 else "%.2f GiB" if g < 10 else "%.1f GiB") % g


def as_limited(limit):
    def pre():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return pre


def server(args, tmp_path, preexec=None, timeout=60):
    return subprocess.run([BIN, "server", "--port", "1", "--http-port", "0",
                           "--data-dir", str(tmp_path / "l2")] + list(args),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=preexec,
                          cwd=str(tmp_path))


@pytest.mark.skipif(bool(SANITIZER), reason="the sanitizers' shadow memory needs an unlimited RLIMIT_AS")
@pytest.mark.parametrize("dry", [True, False])
def test_preallocated_pool_larger_than_the_host_is_refused(tmp_path, dry):
    """--no-l1-use-lazy with twice MemTotal: exit 2 before anything is
    created, naming MemAvailable and MemTotal. (RLIMIT_AS = MemTotal keeps
    a server that did not check from allocating: its mapping fails.)"""
    total = meminfo("MemTotal")
    size_gb = round(2 * total / GIB, 3)
    r = server(["--l1-size-gb", "%.3f" % size_gb, "--no-l1-use-lazy"] + (["--dry-run"] if dry else []),
               tmp_path, preexec=as_limited(total))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--l1-size-gb: %s preallocated (--no-l1-use-lazy)" % gib(size_gb * GIB) in r.stderr, r.stderr
    assert "RLIMIT_AS" in r.stderr
    assert "MemAvailable" in r.stderr and "MemTotal %s" % gib(total) in r.stderr, r.stderr
    assert "or less" in r.stderr
    assert not (tmp_path / "l2").exists()  # nothing created
    assert r.stdout == ""


@pytest.mark.skipif(bool(SANITIZER), reason="the sanitizers' shadow memory needs an unlimited RLIMIT_AS")
@pytest.mark.parametrize("dry", [True, False])
def test_mapping_beyond_rlimit_as_is_refused(tmp_path, dry):
    """Even a lazy pool is mapped whole: beyond RLIMIT_AS it exits 2 naming
    the limit, before the L2 directory exists."""
    r = server(["--l1-size-gb", "4"] + (["--dry-run"] if dry else []), tmp_path,
               preexec=as_limited(2 * GIB))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "RLIMIT_AS 2.00 GiB" in r.stderr and "ulimit -v" in r.stderr, r.stderr
    assert not (tmp_path / "l2").exists()


@pytest.mark.parametrize("dry", [True, False])
def test_size_beyond_what_l1_addresses_is_one_range_checked_first(tmp_path, dry):
    """16384 GiB at 4 KiB pages is past L1's 2^32 pages: the flag's range
    says so, exit 2, before the L2 directory is created (it used to pass
    the flag and fail at start with exit 1)."""
    r = server(["--l1-size-gb", "16384"] + (["--dry-run"] if dry else []), tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--l1-size-gb: 16384 is out of range [0.001, 16383.998]" in r.stderr, r.stderr
    assert not (tmp_path / "l2").exists()
    # the range follows --l1-align-bytes: 512-byte pages reach 2 TiB
    r = server(["--l1-size-gb", "4096", "--l1-align-bytes", "512", "--dry-run"], tmp_path)
    assert r.returncode == 2 and "out of range [0.001, 2047.998]" in r.stderr, r.stderr


def test_huge_pages_beyond_the_free_ones_refused_by_dry_run(tmp_path):
    with open("/proc/sys/vm/nr_hugepages") as f:
        if int(f.read()) > 0:
            pytest.skip("huge pages are reserved on this machine")
    r = server(["--l1-size-gb", "1", "--l1-use-hugepages", "--dry-run"], tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout)
    assert "free huge pages" in r.stderr and "vm.nr_hugepages" in r.stderr, r.stderr


def test_lazy_pool_beyond_the_host_warns_in_dry_run(tmp_path):
    total = meminfo("MemTotal")
    size_gb = round(2 * total / GIB)
    r = server(["--l1-size-gb", str(size_gb), "--dry-run"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert ("kvtier server: warning: --l1-size-gb: %s (lazy) is more than this host "
            "could ever back" % gib(size_gb * GIB)) in r.stderr, r.stderr
    hm = json.loads(r.stdout)["l1"]["host_memory"]
    assert hm["verdict"] == "warning" and hm["backable_bytes"] <= total
    assert "MemTotal" in hm["warning"]
    # a pool that fits says nothing
    r = server(["--l1-size-gb", "0.5", "--dry-run"], tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    hm = json.loads(r.stdout)["l1"]["host_memory"]
    assert hm["verdict"] == "fits" and hm["warning"] is None
    # --no-storage-check: a config for another machine is not judged here
    r = server(["--l1-size-gb", str(size_gb), "--dry-run", "--no-storage-check"], tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["l1"]["host_memory"] is None


def test_lazy_pool_beyond_the_host_starts_with_a_warning_everywhere(make_server, tmp_path):
    """Lazy: nothing is allocated at start (the initial size is 0.25 GiB,
    sparse), so it starts; the warning is in the log, /status and the
    `kvtier status` table."""
    total = meminfo("MemTotal")
    size_gb = round(2 * total / GIB)
    s = make_server(["--l1-size-gb", str(size_gb), "--no-l2"])
    log = s.read_log()
    assert "WARN  L1: --l1-size-gb: %s (lazy) is more than this host could ever back" % gib(size_gb * GIB) in log, log
    st = json.loads(s.http_get("/status")[1])
    assert st["l1"]["host_memory"]["verdict"] == "warning"
    assert "could ever back" in st["l1"]["host_memory"]["warning"]
    r = run_kvtier("status", "--url", s.url)
    assert r.returncode == 0, r.stderr
    assert "warning: L1: --l1-size-gb: %s (lazy)" % gib(size_gb * GIB) in r.stdout, r.stdout


def _memory_cgroup():
    """A fresh memory cgroup at the root of this host's memory hierarchy
    (v2, else v1), or None when none can be made (not root, no controller)."""
    cands = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, post = line.split(" - ", 1)
            mp = pre.split()[4]
            fstype, _, sopts = (post.split() + ["", ""])[:3]
            if fstype == "cgroup2" and os.path.exists(os.path.join(mp, "cgroup.subtree_control")):
                with open(os.path.join(mp, "cgroup.subtree_control")) as sc:
                    if "memory" in sc.read().split():
                        cands.append((mp, "memory.max"))
            elif fstype == "cgroup" and "memory" in sopts.split(","):
                cands.append((mp, "memory.limit_in_bytes"))
    for mp, limit_file in cands:
        d = os.path.join(mp, "kvtier-test-%d" % os.getpid())
        try:
            os.mkdir(d)
            with open(os.path.join(d, limit_file), "w") as f:
                f.write(str(256 * 2**20))
            return d, limit_file
        except OSError:
            try:
                os.rmdir(d)
            except OSError:
                pass
    return None


def test_preallocated_pool_beyond_the_cgroup_limit_is_refused(tmp_path):
    """Inside a memory cgroup of 256 MiB, a preallocated 1 GiB pool exits 2
    naming the cgroup's limit file (a server that did not check would be
    killed inside that cgroup, never touch the rest of the host)."""
    cg = _memory_cgroup()
    if not cg:
        pytest.skip("cannot create a memory cgroup here")
    d, limit_file = cg

    def enter():
        with open(os.path.join(d, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    try:
        r = server(["--l1-size-gb", "1", "--no-l1-use-lazy"], tmp_path, preexec=enter)
    finally:
        os.rmdir(d)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "cgroup limit 0.25 GiB (%s)" % os.path.join(d, limit_file) in r.stderr, r.stderr
    assert "give --l1-size-gb 0.2" in r.stderr, r.stderr  # 0.24 or 0.23: the cgroup's usage
    assert not (tmp_path / "l2").exists()
