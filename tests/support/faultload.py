"""Steady verified load on one kvtier server, for fault tests of remote
tiers (test_resp_faults.py; bench/resp_soak.py runs it longer).

Two client threads on the server: a writer stores and flushes batches of
fresh keys, a reader looks up and retrieves every batch the writer's flush
acknowledged, checking every byte. The server runs with
--l2-store-policy skip_l1, so a stored object leaves L1 once it is in L2 and
every read comes from the remote tier. Keys are grouped (group_of: e.g. the
Redis Cluster master that owns each key's slot): a batch holds keys of one
group only, so a fault of one node shows in its group's requests and not in
the others'. Every request is recorded (op, group, start, end, keys, keys
served) for the tests' bounds."""

import hashlib
import os
import threading
import time

import kvtier

SIZE = 16 << 10  # bytes per object
BATCH = 8        # keys per batch


def payload(h):
    """The bytes stored under the key with chunk hash h (derived from it:
    nothing to keep in memory, and a value read back under another key is
    caught)."""
    return hashlib.shake_256(h).digest(SIZE)


def crc16(data):
    """CRC16-CCITT (XMODEM), as the Redis Cluster spec."""
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def wire_key(prefix, model, h):
    """The adapter's key for chunk hash h (kv_rank 0, group 0, no salt)."""
    return ("%s@%s@0x%08x@%x@%s" % (prefix, model, 0, 0, h.hex())).encode()


def slot_of(prefix, model, h):
    return crc16(wire_key(prefix, model, h)) & 16383


class Op:
    __slots__ = ("op", "group", "t0", "t1", "want", "got", "error")

    def __init__(self, op, group, t0, t1, want, got, error=None):
        self.op, self.group, self.t0, self.t1 = op, group, t0, t1
        self.want, self.got, self.error = want, got, error

    @property
    def secs(self):
        return self.t1 - self.t0

    def __repr__(self):
        return "%s[%s] %.3fs %d/%d%s" % (self.op, self.group, self.secs, self.got, self.want,
                                          " " + self.error if self.error else "")


class Load:
    """The load: start(), then stop() (joins; re-raises a thread's failure,
    such as a wrong byte). ops: every request so far. pending(group): the
    acknowledged batches of group not yet read back in full."""

    def __init__(self, server, model, groups, group_of, timeout_ms=5000, pace_s=0.02):
        self.server, self.model = server, model
        self.groups = list(groups)
        self.group_of = group_of
        self.timeout_ms = timeout_ms
        self.pace_s = pace_s
        self.ops = []
        self.errors = []
        self.wrong_bytes = 0
        self.verified = 0  # objects read back and checked
        self.stored = 0    # objects acknowledged by a flush
        self.lock = threading.Lock()
        self.unread = {g: [] for g in self.groups}  # acknowledged, not yet read in full
        self.stop_ev = threading.Event()
        self.threads = []
        self.pool = {g: [] for g in self.groups}
        self.salt = os.urandom(8)
        self.next = 0
        self.held = set()  # groups the reader leaves alone for now (a backlog builds up)

    # ---- keys
    def _fresh(self, group):
        """BATCH fresh chunk hashes of group."""
        pool = self.pool[group]
        while len(pool) < BATCH:
            h = hashlib.sha256(self.salt + self.next.to_bytes(8, "little")).digest()
            self.next += 1
            g = self.group_of(h)
            if g in self.pool:
                self.pool[g].append(h)
        out, self.pool[group] = pool[:BATCH], pool[BATCH:]
        return out

    def _rec(self, op, group, t0, want, got, error=None):
        o = Op(op, group, t0, time.monotonic(), want, got, error)
        with self.lock:
            self.ops.append(o)
        return o

    # ---- threads
    def _writer(self):
        with self.server.client(timeout_ms=self.timeout_ms) as c:
            while not self.stop_ev.is_set():
                for g in self.groups:
                    hs = self._fresh(g)
                    keys = kvtier.Keys(self.model, hs)
                    t0 = time.monotonic()
                    try:
                        c.store(keys, [payload(h) for h in hs])
                        self._rec("store", g, t0, BATCH, BATCH)
                        t0 = time.monotonic()
                        res = c.flush()
                    except kvtier.KvtierError as e:
                        self._rec("flush", g, t0, BATCH, 0, e.name)
                        continue
                    ok = not res
                    self._rec("flush", g, t0, BATCH, BATCH if ok else 0)
                    if ok:
                        with self.lock:
                            self.unread[g].append((time.monotonic(), hs))
                            self.stored += BATCH
                self.stop_ev.wait(self.pace_s)  # the load's rate, not a wait for a state

    def _reader(self):
        with self.server.client(timeout_ms=self.timeout_ms) as c:
            while not self.stop_ev.is_set():
                for g in self.groups:
                    with self.lock:
                        ready = self.unread[g] and g not in self.held
                        item = self.unread[g].pop(0) if ready else None
                    if item is None:
                        continue
                    hs = item[1]
                    keys = kvtier.Keys(self.model, hs)
                    t0 = time.monotonic()
                    try:
                        n = c.lookup(keys)
                        got = c.retrieve(keys) if n else []
                    except kvtier.KvtierError as e:
                        self._rec("read", g, t0, BATCH, 0, e.name)
                        with self.lock:
                            self.unread[g].append(item)
                        continue
                    self._rec("read", g, t0, BATCH, len(got))
                    bad = [i for i, v in enumerate(got) if bytes(v) != payload(hs[i])]
                    with self.lock:
                        self.verified += len(got) - len(bad)
                        self.wrong_bytes += len(bad)
                        if len(got) < BATCH:  # read again later: it must come back
                            self.unread[g].append(item)
                    if bad:
                        raise AssertionError("wrong bytes for %d keys of group %s" % (len(bad), g))
                self.stop_ev.wait(self.pace_s)

    def _run(self, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001  (re-raised by stop())
            self.errors.append(e)
            self.stop_ev.set()

    def start(self):
        for fn in (self._writer, self._reader):
            t = threading.Thread(target=self._run, args=(fn,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads), "a load thread hangs"
        if self.errors:
            raise self.errors[0]

    def hold(self, group):
        """The reader leaves group's batches unread until release(group):
        a backlog of acknowledged batches to read during a fault."""
        with self.lock:
            self.held.add(group)

    def release(self, group):
        with self.lock:
            self.held.discard(group)

    # ---- views
    def pending(self, group=None, before=None):
        """Acknowledged batches not read back in full yet (of group; with
        before, only those acknowledged before that monotonic time)."""
        with self.lock:
            return sum(1 for g, v in self.unread.items() if group is None or g == group
                       for t, _ in v if before is None or t < before)

    def since(self, t, op=None, group=None):
        """Requests that started at monotonic time t or later."""
        with self.lock:
            return [o for o in self.ops if o.t0 >= t and (op is None or o.op == op) and
                    (group is None or o.group == group)]

    def during(self, t0, t1):
        """Requests that were in flight at some moment of [t0, t1]."""
        with self.lock:
            return [o for o in self.ops if o.t1 >= t0 and o.t0 <= t1]

    def count(self, pred):
        with self.lock:
            return sum(1 for o in self.ops if pred(o))
