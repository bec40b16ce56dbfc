"""Description: the Debian package (`make deb`, CPack's DEB generator) has
the right metadata (Depends from dpkg-shlibdeps plus adduser, conffiles),
passes lintian without errors, installs with dpkg into a fresh Debian root
(`make debroot`: a debootstrap tree) and runs from there under chroot:
`kvtier --version` and a C round trip against the packaged library. Without
that root, the extracted package (dpkg -x) runs on this host instead.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

from support.install import ROUND_TRIP_C, InstalledServer, needs_build_tree
from support.paths import BIN

BUILD = os.path.dirname(os.path.abspath(BIN))
DEBROOT = os.environ.get("KVT_DEBROOT", os.path.join(BUILD, "debroot"))
needs_cpack = pytest.mark.skipif(not shutil.which("cpack") or not shutil.which("dpkg-deb"),
                                 reason="cpack or dpkg-deb missing")
# what the binary and the library link (objdump -p: NEEDED; xxhash is inlined)
RUNTIME = ("adduser", "libc6", "libzmq5", "libjansson4", "libssl3",
           "libmicrohttpd12", "liburing2", "libhiredis0.14", "libcurl4", "libmsgpackc2",
           "liblz4-1", "libzstd1", "libblkid1")


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    out = tmp_path_factory.mktemp("deb")
    subprocess.run(["cpack", "-G", "DEB", "-B", str(out / "work"), "-D",
                    "CPACK_OUTPUT_FILE_PREFIX=%s" % out], cwd=BUILD, check=True,
                   stdout=subprocess.DEVNULL)
    debs = glob.glob(str(out / "kvtier_*.deb"))
    assert len(debs) == 1, debs
    return debs[0]


def field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", deb, name], capture_output=True, text=True,
                          check=True).stdout.strip()


def dep_names(deb):
    return {re.sub(r"\s*\(.*\)", "", d).strip() for d in field(deb, "Depends").split(",")}


def compile_round_trip(tmp_path, root):
    """The C round trip built against root's installed headers and library."""
    if not shutil.which("cc"):
        pytest.skip("cc missing")
    src = tmp_path / "rt.c"
    src.write_text(ROUND_TRIP_C)
    exe = tmp_path / "rt"
    subprocess.run(["cc", "-std=c11", "-o", str(exe), str(src), "-I%s/usr/include" % root,
                    "-L%s/usr/lib" % root, "-lkvtier_client"], check=True)
    return exe


@needs_build_tree
@needs_cpack
def test_package_metadata(deb):
    assert field(deb, "Package") == "kvtier"
    assert re.fullmatch(r"\d+\.\d+\.\d+-1", field(deb, "Version"))
    assert dep_names(deb) == set(RUNTIME), dep_names(deb)
    info = subprocess.run(["dpkg-deb", "--info", deb], capture_output=True, text=True,
                          check=True).stdout
    for part in ("conffiles", "postinst", "shlibs", "triggers"):
        assert part in info, info
    ctl = subprocess.run(["dpkg-deb", "--ctrl-tarfile", deb], capture_output=True, check=True).stdout
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(ctl)) as t:
        conf = t.extractfile("./conffiles").read().decode().split()
    assert conf == ["/etc/kvtier/cache.env", "/etc/kvtier/quotas.json"]
    files = subprocess.run(["dpkg-deb", "-c", deb], capture_output=True, text=True,
                           check=True).stdout
    for f in ("./usr/bin/kvtier", "./usr/lib/libkvtier_client.so.0", "./usr/lib/pkgconfig/kvtier.pc",
              "./lib/systemd/system/kvtier.service", "./usr/share/man/man1/kvtier.1.gz",
              "./usr/share/man/man5/kvtier-cache.env.5.gz", "./usr/share/doc/kvtier/copyright"):
        assert f in files, f


@needs_build_tree
@needs_cpack
@pytest.mark.skipif(not shutil.which("lintian"), reason="lintian not installed (Debian's lintian "
                    "package; scripts/install-deps.sh installs it)")
def test_lintian_no_errors(deb):
    r = subprocess.run(["lintian", "--no-tag-display-limit", deb], capture_output=True, text=True)
    errors = [l for l in (r.stdout + r.stderr).splitlines() if l.startswith("E:")]
    assert not errors, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr


@needs_build_tree
@needs_cpack
@pytest.mark.skipif(os.geteuid() != 0, reason="chroot and dpkg --root need root")
@pytest.mark.skipif(not os.path.exists(os.path.join(DEBROOT, "usr/bin/dpkg")),
                    reason="no fresh Debian root at %s: `make debroot` makes one with debootstrap "
                    "(test_extracted_package_runs checks the package without it)" % DEBROOT)
def test_install_into_fresh_debian_root_and_run(deb, tmp_path):
    root = DEBROOT
    shutil.copy(deb, os.path.join(root, "tmp", "kvtier.deb"))

    def ch(*cmd, **kw):
        return subprocess.run(["chroot", root] + list(cmd), capture_output=True, text=True, **kw)

    ch("dpkg", "--purge", "kvtier")  # a previous run's
    r = ch("dpkg", "-i", "/tmp/kvtier.deb")
    # dpkg -i fails on an unmet Depends: the root has only minbase and Depends
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        assert ch("dpkg-query", "-W", "-f=${Status}", "kvtier").stdout == "install ok installed"
        assert ch("getent", "passwd", "kvtier").stdout.startswith("kvtier:")  # the postinst's user
        v = ch("kvtier", "--version", check=True)
        assert v.stdout.strip() == "kvtier %s" % field(deb, "Version").split("-")[0]
        d = ch("kvtier", "server", "--config", "/etc/kvtier/cache.env", "--dry-run",
               "--no-storage-check")
        assert d.returncode == 0, d.stderr
        # the server in the root, the C round trip in the root, over TCP
        exe = compile_round_trip(tmp_path, root)
        shutil.copy(exe, os.path.join(root, "tmp", "kvt-rt"))
        data = "/var/tmp/kvtier-test-%d" % os.getpid()
        s = InstalledServer("/usr/bin/kvtier", [], tmp_path, data_dir=data)
        s.cmd = lambda: ["chroot", root] + InstalledServer.cmd(s)
        s.start(wait=False)
        try:
            s.wait_ready()
            rt = ch("/tmp/kvt-rt", s.url, timeout=60)
            assert rt.returncode == 0 and rt.stdout == "hello from the C API\n", rt.stdout + rt.stderr
            # the program ran against the packaged library inside the root
            ldd = ch("ldd", "/tmp/kvt-rt").stdout
            # (/lib is /usr/lib in a merged-/usr root)
            assert re.search(r"libkvtier_client\.so\.0 => (/usr)?/lib/libkvtier_client\.so\.0", ldd), ldd
        finally:
            s.kill()
            shutil.rmtree(root + data, ignore_errors=True)
    finally:
        ch("dpkg", "--purge", "kvtier")
        for f in ("kvtier.deb", "kvt-rt"):
            if os.path.exists(os.path.join(root, "tmp", f)):
                os.remove(os.path.join(root, "tmp", f))


@needs_build_tree
@needs_cpack
def test_extracted_package_runs(deb, tmp_path):
    """Without a chroot: dpkg -x into a temporary root, Depends satisfied by
    this host's installed packages (what dpkg --dry-run checks), and the
    packaged binary and library do a round trip."""
    root = tmp_path / "x"
    subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    for d in field(deb, "Depends").split(","):
        m = re.fullmatch(r"\s*([^\s(]+)\s*(?:\((\S+)\s+([^)]+)\))?\s*", d)
        assert m, d
        name, op, ver = m.groups()
        have = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True,
                              text=True)
        assert have.returncode == 0 and have.stdout, "Depends %s: not installed here" % name
        if op:
            assert subprocess.run(["dpkg", "--compare-versions", have.stdout, op.replace(">=", "ge")
                                   .replace("<=", "le").replace(">>", "gt").replace("<<", "lt")
                                   .replace("=", "eq"), ver]).returncode == 0, (name, have.stdout, d)
    kv = str(root / "usr/bin/kvtier")
    assert subprocess.run([kv, "--version"], capture_output=True, text=True,
                          check=True).stdout.startswith("kvtier ")
    exe = compile_round_trip(tmp_path, root)
    s = InstalledServer(kv, [], tmp_path, data_dir=str(tmp_path / "data"))
    s.start()
    try:
        rt = subprocess.run([str(exe), s.url], capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, LD_LIBRARY_PATH=str(root / "usr/lib")))
        assert rt.returncode == 0 and rt.stdout == "hello from the C API\n", rt.stdout + rt.stderr
    finally:
        s.kill()
