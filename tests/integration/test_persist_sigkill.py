"""SIGKILL during a sustained write load, 20 times at random moments, for fs,
nixl_store_dynamic and raw_block: after each restart every key whose store
was acknowledged by flush() before the kill is found with exactly its bytes,
and no key ever returns other bytes than the ones stored for it."""

import hashlib
import os
import random
import threading
import time

import pytest

import kvtier
from support.data import adapter_json
from support.paths import SANITIZER
from support.server import Kills

MiB = 1 << 20
# 20 kills per adapter; 10 in the (much slower) sanitizer reruns, 100 with KVT_LONG=1
KILLS = 100 if os.environ.get("KVT_LONG") else (10 if SANITIZER else 20)
BATCH = 8
MAX_BATCHES_PER_ROUND = 25


def batch_keys(tag, bid):
    return kvtier.Keys("sigkill-" + tag,
                       [hashlib.sha256(b"%s-%d-%d" % (tag.encode(), bid, j)).digest()
                        for j in range(BATCH)])


def batch_payloads(tag, bid):
    """Deterministic per (tag, batch): regenerated for checking, never kept."""
    r = random.Random("%s/%d" % (tag, bid))
    return [r.randbytes(r.randint(1, 8) * 1024 + r.randint(0, 300)) for _ in range(BATCH)]


class Writer(threading.Thread):
    """Stores batches, flushing after every second one; a batch counts as
    acknowledged once a flush() issued after its store returned, with no
    kill in between (support.server.Kills). An error that no kill explains
    is kept in .error and fails the round."""

    def __init__(self, server, tag, first_bid, kills):
        super().__init__(daemon=True)
        self.server, self.tag, self.bid, self.kills = server, tag, first_bid, kills
        self.stop = threading.Event()
        self.acked, self.attempted = [], []
        self.error = None

    def run(self):
        pending, pending_since = [], None
        since = self.kills.done
        try:
            with self.server.client(timeout_ms=Kills.timeout_ms) as c:
                while not self.stop.is_set() and len(self.attempted) < MAX_BATCHES_PER_ROUND:
                    since = self.kills.done
                    bid = self.bid
                    self.bid += 1
                    self.attempted.append(bid)
                    if not pending:
                        pending_since = since
                    n = c.store(batch_keys(self.tag, bid), batch_payloads(self.tag, bid))
                    assert n == BATCH, "batch %d: %d of %d stored" % (bid, n, BATCH)
                    pending.append(bid)
                    if len(pending) == 2:
                        since = self.kills.done
                        c.flush()
                        if self.kills.begun == pending_since:
                            self.acked.extend(pending)
                        pending = []
        except kvtier.KvtierError as e:
            if not self.kills.excused(since, e):
                self.error = e
        except AssertionError as e:
            self.error = e


def check_exact(c, tag, bid):
    got = c.retrieve(batch_keys(tag, bid))
    assert got == batch_payloads(tag, bid), "acknowledged batch %d lost or changed" % bid


def check_prefix(c, tag, bid):
    want = batch_payloads(tag, bid)
    got = c.retrieve(batch_keys(tag, bid))
    assert got == want[:len(got)], "batch %d returned other bytes" % bid


def kill_loop(s, tag, seed):
    rnd = random.Random(seed)
    acked, bid = [], 0
    t0 = time.time()
    killer = Kills()
    for k in range(KILLS):
        w = Writer(s, tag, bid, killer)
        w.start()
        time.sleep(rnd.uniform(0.02, 0.3))  # a random moment under load
        killer.kill(s)
        w.stop.set()
        s.start()
        w.join(timeout=60)
        assert not w.is_alive()
        assert w.error is None, w.error
        bid = w.bid
        acked.extend(w.acked)
        st = s.wait_recovered()["l2"][0]
        assert st["is_healthy"], st["health"]
        unacked = [b for b in w.attempted if b not in set(w.acked)]
        with s.client() as c:
            for b in w.acked:  # this round's acknowledged batches: all there
                check_exact(c, tag, b)
            for b in rnd.sample(acked, min(20, len(acked))):  # and older ones
                check_exact(c, tag, b)
            for b in unacked:  # never acknowledged: absent or exact, never other bytes
                check_prefix(c, tag, b)
            st = c.status()["l2"][0]
            assert st["counters"]["corrupt"] == 0
    with s.client() as c:  # finally every acknowledged batch, all rounds
        for b in acked:
            check_exact(c, tag, b)
    assert len(acked) > KILLS  # the load was sustained, not idle
    print("%s: %d requests lost with a killed connection (%d ms timeouts)" %
          (tag, killer.timeouts, Kills.timeout_ms))
    return len(acked), time.time() - t0


def test_sigkill_fs(make_server, tmp_path):
    s = make_server(["--l2-adapter", adapter_json(type="fs", base_path=str(tmp_path / "fs"))])
    n, secs = kill_loop(s, "fs", 1)
    print("fs: %d acknowledged batches over %d kills in %.1f s" % (n, KILLS, secs))


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_sigkill_nixl_store_dynamic(make_server, tmp_path, engine):
    spec = adapter_json(type="nixl_store_dynamic", backend="POSIX", io_engine=engine,
                        backend_params={"file_path": str(tmp_path / "nd"), "use_direct_io": "true",
                                        "max_capacity_gb": 1, "shard_dirs": "true"})
    s = make_server(["--l2-adapter", spec])
    n, secs = kill_loop(s, "nd-" + engine, 2)
    print("nixl_store_dynamic/%s: %d acknowledged batches in %.1f s" % (engine, n, secs))


@pytest.mark.parametrize("engine", ["posix", "io_uring"])
def test_sigkill_raw_block(make_server, tmp_path, engine):
    img = tmp_path / "rb.img"
    # room for every object the writers can attempt: a full device refuses
    # stores, and flush() acknowledges refused stores too
    slots = KILLS * MAX_BATCHES_PER_ROUND * BATCH + 64
    with open(img, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, 16 * MiB + slots * (16384 + 4096))  # + header_bytes
    spec = adapter_json(type="raw_block", device_path=str(img), slot_bytes=16384,
                        meta_total_bytes=16 * MiB, io_engine=engine,
                        meta_checkpoint_interval_sec=1, meta_idle_quiet_ms=20)
    s = make_server(["--l2-adapter", spec])
    n, secs = kill_loop(s, "rb-" + engine, 3)
    with s.client() as c:
        st = c.status()["l2"][0]
        meta = st["meta"]
    assert meta["checkpoint_error"] is None and st["free_slots"] > 0
    print("raw_block/%s: %d acknowledged batches in %.1f s (%s)" % (engine, n, secs,
                                                                    meta["recovered_from"]))
