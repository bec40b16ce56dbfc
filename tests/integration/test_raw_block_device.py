"""raw_block formats only what is empty or already its own: a device or
file holding an ext4 file system, a partition table or other data is
refused by `--dry-run` and by the start, with nothing written (its checksum
is the same afterwards) and a message naming "format": "force"; zeros and a
device a previous kvtier run formatted are accepted; "format": "force"
formats foreign content and wipes its signatures; a mounted device is
refused whatever "format" says, and so is the file behind a loop device.

Each content case runs on a regular file and on a loop device over it
(losetup, as root); where loop devices are unavailable the loop cases skip
and say so, and the file cases still run."""

import hashlib
import os
import shutil
import subprocess

import pytest

from support.data import adapter_json, keys_for, random_payloads
from support.paths import BIN
from support.server import real_start

MiB = 1 << 20
SIZE = 64 * MiB


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(MiB)
            if not b:
                return h.hexdigest()
            h.update(b)


def run(*cmd):
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def losetup(path):
    r = run("losetup", "--find", "--show", path)
    dev = r.stdout.strip()
    return dev if r.returncode == 0 and dev.startswith("/dev/loop") else None


def zeros(path):
    with open(path, "wb") as f:
        f.truncate(SIZE)


def ext4(path):
    zeros(path)
    if not shutil.which("mkfs.ext4"):
        pytest.skip("mkfs.ext4 is not installed (Debian: e2fsprogs)")
    r = run("mkfs.ext4", "-q", "-F", path)
    assert r.returncode == 0, r.stderr


def partition_table(path):
    """An MBR with one Linux partition (what sfdisk or parted write first)."""
    zeros(path)
    entry = bytes([0x00, 0, 0, 0, 0x83, 0, 0, 0]) + (2048).to_bytes(4, "little") + \
        ((SIZE >> 9) - 2048).to_bytes(4, "little")
    with open(path, "r+b") as f:
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")


def random_bytes(path):
    """Random bytes whose first byte is non-zero (urandom gives a zero one in 1 of 256 fills,
    and the refusal names the first non-zero byte's offset)."""
    with open(path, "wb") as f:
        for i in range(SIZE // MiB):
            block = bytearray(os.urandom(MiB))
            if i == 0:
                block[0] |= 1
            f.write(block)


FOREIGN = {"ext4": (ext4, "ext4 file system"), "partition-table": (partition_table,
                                                                   "dos partition table"),
           "random-bytes": (random_bytes, "non-zero byte at offset 0")}


@pytest.fixture(params=["file", "loop"])
def device(request, tmp_path):
    """make(fill) -> (device_path, backing file)."""
    loops = []

    def make(fill):
        img = str(tmp_path / "dev.img")
        fill(img)
        if request.param == "file":
            return img, img
        dev = losetup(img)
        if not dev:
            pytest.skip("no loop device here (losetup not permitted): the same checks ran on "
                        "a regular file in the [file] cases")
        loops.append(dev)
        return dev, img

    yield make
    for dev in loops:
        run("losetup", "-d", dev)


def spec(dev, **kw):
    return adapter_json(type="raw_block", device_path=dev, slot_bytes=MiB,
                        meta_total_bytes=4 * MiB, **kw)


def dry_run(s):
    return subprocess.run([BIN, "server", "--dry-run", "--l2-adapter", s], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("content", sorted(FOREIGN))
def test_foreign_content_is_refused_untouched(device, content, tmp_path):
    fill, found = FOREIGN[content]
    dev, img = device(fill)
    before = sha(img)
    r = dry_run(spec(dev))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert found in r.stderr and '"format": "force"' in r.stderr, r.stderr
    assert '--l2-adapter #0 (raw_block): "device_path": ' in r.stderr, r.stderr
    started, rc, log = real_start(spec(dev), str(tmp_path))
    assert not started and rc == 2 and found in log, log
    assert sha(img) == before  # not one byte written


def test_zeros_and_its_own_format_are_accepted(device, make_server, tmp_path):
    dev, img = device(zeros)
    r = dry_run(spec(dev))
    assert r.returncode == 0, r.stderr
    s = make_server(["--l2-adapter", spec(dev)])
    keys, pay = keys_for("rbdev", 4), random_payloads(4, MiB, seed=2)  # 1 MiB slots hold 1 MiB
    with s.client() as c:
        assert c.store(keys, pay) == 4
        assert c.flush().l2_failed == 0
    s.stop()
    # what a previous run wrote is kvtier's own: accepted, and recovered
    r = dry_run(spec(dev))
    assert r.returncode == 0, r.stderr
    s.start()
    st = s.wait_recovered()["l2"][0]
    assert st["objects"] == 4 and st["is_healthy"], st
    s.stop()


def test_force_formats_foreign_content(device, make_server, tmp_path):
    dev, img = device(ext4)
    s = make_server(["--l2-adapter", spec(dev, format="force")])
    assert "overwrites it" in s.read_log()
    with s.client() as c:
        assert c.store(keys_for("forced", 2), random_payloads(2, 1000)) == 2
        assert c.flush().l2_failed == 0
    s.stop()
    # the file system's signatures are gone: nothing takes the device for
    # ext4 any more, and without force it is kvtier's own
    if shutil.which("blkid"):
        r = run("blkid", "-p", img)
        assert "ext4" not in r.stdout, r.stdout
    r = dry_run(spec(dev))
    assert r.returncode == 0, r.stderr


@pytest.fixture
def mounted(tmp_path):
    img = str(tmp_path / "fs.img")
    ext4(img)
    dev = losetup(img)
    if not dev:
        pytest.skip("no loop device here (losetup not permitted): cannot mount one")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run("mount", "-o", "ro", "-t", "ext4", dev, str(mnt))
    if r.returncode != 0:
        run("losetup", "-d", dev)
        pytest.skip("cannot mount a loop device here: %s" % r.stderr.strip())
    yield dev, img, str(mnt)
    run("umount", str(mnt))
    run("losetup", "-d", dev)


@pytest.mark.parametrize("force", [False, True])
def test_mounted_device_is_refused(mounted, tmp_path, force):
    dev, img, mnt = mounted
    before = sha(img)
    extra = {"format": "force"} if force else {}
    r = dry_run(spec(dev, **extra))
    assert r.returncode == 2 and "is mounted at %s" % mnt in r.stderr, r.stderr
    started, rc, log = real_start(spec(dev, **extra), str(tmp_path))
    assert not started and rc == 2 and "is mounted at" in log, log
    # the file behind it, too
    r = dry_run(spec(img, **extra))
    assert r.returncode == 2 and "backs the loop device %s" % dev in r.stderr, r.stderr
    assert sha(img) == before
