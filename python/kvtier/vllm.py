"""kvtier as a vLLM v1 KV connector.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"url": "tcp://127.0.0.1:5555"}}'

Scheduler side (one per engine): one kvtier `lookup` per request (the server
pulls L2 hits into L1 while answering), the hit is loaded asynchronously
(vLLM's async load: the request waits in WAITING_FOR_REMOTE_KVS while others
run), and every full chunk of the prompt that kvtier lacks is stored once the
forward pass that computed it is done.

Worker side (one per tensor-parallel rank): a background thread owns the
worker's kvtier client. Loads: `retrieve_view` (prepare_retrieve) and a
scatter from the shared-memory pool into the request's blocks; stores:
`store_view` (prepare_store), a gather of the chunk's blocks straight into
the pool, commit. No intermediate buffer, no pickling; when the server is on
another host the same calls move the bytes inline in ZeroMQ frames.

Failure: kvtier down, slow or restarting means a recompute, never a failed
request: lookups report 0 hits, loads report their blocks through vLLM's
load-error path (`get_block_ids_with_load_errors`, with
`kv_load_failure_policy` "recompute", which this connector sets unless the
extra config says `"load_failure_policy": "fail"`), stores are dropped. Each
failure is counted and logged (rate-limited); the client reconnects by itself.

Extra config keys (`kv_connector_extra_config`):
    url            kvtier server (default tcp://127.0.0.1:5555)
    model_name     the model part of the keys (default: vLLM's served model name)
    timeout_ms     per-request timeout of the connector's clients (default 5000)
    retry_s        after a failure, how long to wait before trying again (default 2)
    chunk_size     used only while the server cannot be reached at start
                   (default 256; the server's `hello` decides otherwise)
    shm            false: never map the server's pool (inline frames only)
    server_key     a server with --auth-key: the file with its public key
    client_key     and the file with this engine's secret key (mode 0600);
                   both or neither (default: $KVTIER_SERVER_KEY and
                   $KVTIER_CLIENT_KEY; docs/security.md)
    load_failure_policy  "recompute" (default) or "fail"
    copy_threads   threads a load or store copies its chunks with on the CPU
                   (default: the CPUs of copy_cpus, at most 4)
    copy_cpus      CPU ids the worker's transfer thread (and its copy threads)
                   run on, or "inherit" (default on the CPU: the CPUs vLLM sets
                   aside for KV transfer, the last core of each NUMA node, as
                   vLLM's own NIXL connector does; docs/vllm.md)
"""

import json
import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

import kvtier
from kvtier.kvcopy import LayoutError, PagedLayout, register_pinned

try:  # vLLM >= 0.11
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # pragma: no cover
    CacheHitSource = None

try:  # the block hashes vLLM's own KV events publish (bytes, or ints by its env)
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
except ImportError:  # pragma: no cover
    maybe_convert_block_hash = None

log = logging.getLogger("vllm.kvtier")  # under vLLM's logger: its handlers and level

__all__ = ["KvtierConnector"]

# The connector-API hooks below that a later vLLM release added to
# KVConnectorBase_V1, and the release that added each: an older release never
# calls them. tests/integration/test_vllm_versions.py checks every method of
# KvtierConnector against the base class of each supported release (0.32,
# 0.33, 0.34; docs/vllm.md) and reads this table.
HOOKS_SINCE = {
    "supports_sleep_mode": "0.33",
    "unregister_kv_caches": "0.33",
    "restore_kv_caches": "0.33",
    "kv_cache_access": "0.34",
}


# ----------------------------------------------------------------- metadata


@dataclass
class LoadJob:
    req_id: str
    salt: str
    hashes: list          # chunk hashes to load, in order
    blocks: list          # per chunk: blocks_per_chunk block ids (-1 = engine has it)


@dataclass
class StoreJob:
    req_id: str
    salt: str
    hashes: list
    blocks: list          # per chunk: blocks_per_chunk block ids
    engine: dict = None   # vLLM's block hashes of these chunks ("blocks" of prepare_store)


@dataclass
class KvtierMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)


# ------------------------------------------------------------------- client


class _Conn:
    """A kvtier client that reconnects by itself and never raises into vLLM:
    after a failure it waits `retry_s` before the next try (a circuit
    breaker), so a dead server costs one timeout, not one per request."""

    def __init__(self, url, timeout_ms, retry_s, shm, stats, who, keys=(None, None)):
        self.url = url
        self.keys = keys
        self.timeout_ms = timeout_ms
        self.retry_s = retry_s
        self.shm = shm
        self.stats = stats
        self.who = who
        self.client = None
        self.down_until = 0.0
        self._last_warn = 0.0

    def get(self):
        if self.client is not None:
            return self.client
        now = time.monotonic()
        if now < self.down_until:
            return None
        try:
            self.client = kvtier.Client(self.url, timeout_ms=self.timeout_ms, shm=self.shm,
                                        server_key=self.keys[0], client_key=self.keys[1])
            if self.stats.get("disconnects"):
                log.info("kvtier %s: connected to %s again", self.who, self.url)
        except Exception as e:  # noqa: BLE001 - any failure means "no cache now"
            self.failed(e, "connect")
            return None
        return self.client

    def failed(self, exc, what):
        self.stats["errors"] = self.stats.get("errors", 0) + 1
        if self.client is not None:
            self.stats["disconnects"] = self.stats.get("disconnects", 0) + 1
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass
        self.client = None
        self.down_until = time.monotonic() + self.retry_s
        now = time.monotonic()
        if now - self._last_warn > 10.0:
            self._last_warn = now
            log.warning("kvtier %s: %s failed (%s); recomputing instead (errors so far: %d)",
                        self.who, what, exc, self.stats["errors"])

    def close(self):
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass
            self.client = None


def _kv_rank(world_size, rank):
    return kvtier.kv_rank(world_size, rank, world_size, rank)


# ----------------------------------------------------------- scheduler side


class _ReqState:
    __slots__ = ("req_id", "salt", "tokens", "hashes", "hits", "local", "blocks",
                 "stored", "ever_stored", "load_pending", "block_hashes")

    def __init__(self, req_id, salt, tokens, hashes):
        self.req_id = req_id
        self.salt = salt
        self.tokens = tokens
        self.hashes = hashes
        self.hits = None          # leading chunks kvtier holds (one lookup)
        self.local = 0            # tokens vLLM's own prefix cache had
        self.blocks = []          # block ids of the request, in order
        self.stored = 0           # chunks stored (or known present) so far
        self.ever_stored = False
        self.load_pending = None  # (first_token, end_token) to load
        self.block_hashes = None  # the request's block hashes (vLLM's list, growing)


class _Scheduler:
    def __init__(self, cfg):
        self.cfg = cfg
        self.stats = {}
        self.conn = _Conn(cfg.url, cfg.timeout_ms, cfg.retry_s, False, self.stats, "scheduler",
                          cfg.auth_keys)
        self.reqs = {}
        self.loads = []
        c = self.conn.get()
        if c is not None:
            cfg.set_chunk_size(c.chunk_size)
            self._check_prefetch_policy(c)
        else:
            log.warning("kvtier: no server at %s at start; assuming chunk size %d until it answers",
                        cfg.url, cfg.chunk_size)

    def _check_prefetch_policy(self, c):
        try:
            policy = c.status().get("prefetch", {}).get("policy")
        except Exception:  # noqa: BLE001
            return
        if policy == "default":
            log.warning("kvtier at %s runs --l2-prefetch-policy default: an object its lookup "
                        "pulls from L2 is freed when the scheduler releases the lookup, so the "
                        "worker reads it from L2 again; start kvtier with "
                        "--l2-prefetch-policy retain for vLLM", self.cfg.url)

    def _state(self, request):
        st = self.reqs.get(request.request_id)
        if st is None:
            tokens = list(request.prompt_token_ids or [])
            hashes = kvtier.chunk_hashes(tokens, self.cfg.chunk_size) if tokens else []
            st = _ReqState(request.request_id, getattr(request, "cache_salt", None) or "",
                           tokens, hashes)
            st.block_hashes = getattr(request, "block_hashes", None)
            self.reqs[request.request_id] = st
        return st

    def _lookup(self, st):
        if not st.hashes:
            return 0
        c = self.conn.get()
        if c is None:
            return 0
        try:
            if not self.cfg.same_chunk_size(c):
                return 0
            keys = self.cfg.keys(st.hashes, st.salt)
            n = c.lookup(keys)
            c.free_locks()  # one-way: the worker's own retrieve pins what it loads
            self.stats["lookups"] = self.stats.get("lookups", 0) + 1
            self.stats["lookup_hit_chunks"] = self.stats.get("lookup_hit_chunks", 0) + n
            return n
        except Exception as e:  # noqa: BLE001
            self.conn.failed(e, "lookup")
            return 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self._state(request)
        if st.hits is None:
            st.hits = self._lookup(st)
        st.stored = max(st.stored, st.hits)
        bs = self.cfg.block_size
        # vLLM computes at least the last prompt token itself
        end = min(st.hits * self.cfg.chunk_size, (len(st.tokens) - 1) // bs * bs)
        need = end - num_computed_tokens
        if need <= 0:
            return 0, False
        st.local = num_computed_tokens
        return need, True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        st = self._state(request)
        ids = blocks.get_block_ids()
        if ids:
            ids = list(ids[0])
            if len(ids) > len(st.blocks):
                st.blocks = ids
        if num_external_tokens > 0 and st.load_pending is None:
            st.load_pending = (st.local, st.local + num_external_tokens)
            self.loads.append(st)

    def _load_job(self, st):
        first, end = st.load_pending
        C, bs, bpc = self.cfg.chunk_size, self.cfg.block_size, self.cfg.blocks_per_chunk
        c0, c1 = first // C, (end + C - 1) // C
        blocks = []
        for c in range(c0, c1):
            row = []
            for b in range(c * bpc, (c + 1) * bpc):
                tok = b * bs
                row.append(st.blocks[b] if first <= tok < end and b < len(st.blocks) else -1)
            blocks.append(row)
        return LoadJob(st.req_id, st.salt, st.hashes[c0:c1], blocks)

    def _store_job(self, st, computed):
        C, bpc = self.cfg.chunk_size, self.cfg.blocks_per_chunk
        full = min(computed, len(st.tokens)) // C
        full = min(full, len(st.hashes), len(st.blocks) // bpc)
        if full <= st.stored:
            return None
        c0 = st.stored
        st.stored = full
        st.ever_stored = True
        return StoreJob(st.req_id, st.salt, st.hashes[c0:full],
                        [st.blocks[c * bpc:(c + 1) * bpc] for c in range(c0, full)],
                        self._engine_blocks(st, c0, full))

    def _engine_blocks(self, st, c0, c1):
        """vLLM's block hashes of chunks c0..c1, converted as vLLM's KV
        events publish them, with the block before them and the tokens:
        kvtier's events then name these chunks as vLLM names their blocks
        (docs/events.md). None when vLLM has not hashed them all."""
        bh, bpc, C = st.block_hashes, self.cfg.blocks_per_chunk, self.cfg.chunk_size
        if maybe_convert_block_hash is None or bh is None or len(bh) < c1 * bpc:
            return None
        conv = maybe_convert_block_hash
        return {"size": self.cfg.block_size,
                "hashes": [conv(h) for h in bh[c0 * bpc:c1 * bpc]],
                "parent": conv(bh[c0 * bpc - 1]) if c0 else None,
                "tokens": st.tokens[c0 * C:c1 * C]}

    def build_connector_meta(self, so):
        meta = KvtierMetadata()
        for st in self.loads:
            meta.loads.append(self._load_job(st))
        self.loads = []
        if self.cfg.disabled:   # another chunk size now: keys of this one would be wrong
            return meta
        for req in so.scheduled_new_reqs:
            st = self.reqs.get(req.req_id)
            if st is None:
                continue
            if req.block_ids:
                st.blocks = list(req.block_ids[0])
            job = self._store_job(st, req.num_computed_tokens + so.num_scheduled_tokens.get(req.req_id, 0))
            if job:
                meta.stores.append(job)
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i]
            if nb is not None:
                if rid in resumed:
                    st.blocks = list(nb[0])
                else:
                    st.blocks.extend(nb[0])
            job = self._store_job(st, cached.num_computed_tokens[i] + so.num_scheduled_tokens.get(rid, 0))
            if job:
                meta.stores.append(job)
        return meta

    def request_finished(self, request, block_ids):
        st = self.reqs.pop(request.request_id, None)
        # blocks stay allocated until the worker reports the stores done
        return bool(st and st.ever_stored), None

    def shutdown(self):
        self.conn.close()


# -------------------------------------------------------------- worker side


class _Worker:
    def __init__(self, cfg):
        self.cfg = cfg
        self.stats = {}
        self.layout = None
        self.q = queue.Queue()
        self.lock = threading.Lock()
        self.pending = {}         # req_id -> stores not yet done
        self.finishing = set()    # finished requests waiting for their stores
        self.store_reqs = set()
        self.done_recv = set()
        self.load_errors = set()
        self.thread = None
        self.conn = None
        self.cpus = None

    def register_kv_caches(self, kv_caches, num_blocks):
        self.conn = _Conn(self.cfg.url, self.cfg.timeout_ms, self.cfg.retry_s, self.cfg.shm,
                          self.stats, "worker", self.cfg.auth_keys)
        c = self.conn.get()
        if c is not None:
            self.cfg.set_chunk_size(c.chunk_size)
        self.cpus = _transfer_cpus(self.cfg.copy_cpus, kv_caches)
        ct = self.cfg.copy_threads
        if ct is None and self.cpus:
            ct = min(4, len(self.cpus))
        try:
            self.layout = PagedLayout(kv_caches, num_blocks, self.cfg.block_size, self.cfg.chunk_size,
                                      copy_threads=ct)
        except LayoutError as e:
            raise ValueError("kvtier connector: %s" % e) from None
        log.info("kvtier worker: %d KV layers, chunk %d tokens = %d blocks = %d bytes, dtype %s, "
                 "server %s (shared memory: %s; copies: %s on CPUs %s)", len(self.layout.layers),
                 self.cfg.chunk_size, self.layout.blocks_per_chunk, self.layout.chunk_bytes,
                 self.layout.dtype_name, self.cfg.url, bool(c and c.shm_active),
                 self.layout.copy_path(), sorted(self.cpus) if self.cpus else "inherited")
        self._pin(c)
        self.thread = threading.Thread(target=self._run, name="kvtier-io", daemon=True)
        self.thread.start()

    def _pin(self, c):
        """CUDA: register the mapped pool as pinned memory (DMA copies)."""
        if self.layout.device.type != "cuda" or c is None or c.pool is None:
            return
        try:
            self._unpin = register_pinned(*c.pool)
            log.info("kvtier worker: pool of %d bytes registered as pinned memory", c.pool[1])
        except Exception as e:  # noqa: BLE001 - copies still work, unpinned
            log.warning("kvtier worker: cannot pin the pool (%s); device copies are not DMA", e)

    # --- called by vLLM on the model-runner thread

    def start_load(self, meta):
        for job in meta.loads:
            self.q.put(("load", job))

    def save(self, meta):
        log.debug("kvtier worker: %d store jobs, %d queued", len(meta.stores), self.q.qsize())
        if not meta.stores:
            return
        with self.lock:
            for job in meta.stores:
                self.pending[job.req_id] = self.pending.get(job.req_id, 0) + 1
                self.store_reqs.add(job.req_id)
        for job in meta.stores:
            self.q.put(("store", job))

    def get_finished(self, finished_req_ids):
        with self.lock:
            for r in finished_req_ids:
                if r in self.store_reqs:
                    self.finishing.add(r)
            sending = {r for r in self.finishing if not self.pending.get(r)}
            self.finishing -= sending
            self.store_reqs -= sending
            recving, self.done_recv = self.done_recv, set()
        return sending or None, recving or None

    def take_load_errors(self):
        with self.lock:
            e, self.load_errors = self.load_errors, set()
        return e

    def drain(self):
        """Wait until every queued transfer is done (preemption, shutdown)."""
        if self.thread is not None:
            self.q.join()

    def shutdown(self):
        if self.thread is not None:
            self.q.put(None)
            self.thread.join(timeout=30)
            self.thread = None
        if self.conn is not None:
            self.conn.close()
        log.info("kvtier worker: %s", self.stats)

    # --- the I/O thread

    def _run(self):
        if self.cpus:
            # this thread only (and the copy threads it starts inherit it): off
            # the cores of vLLM's compute threads, whose model-runner thread
            # spins on its core while a request waits for its load
            try:
                os.sched_setaffinity(0, self.cpus)
            except OSError as e:
                log.warning("kvtier worker: cannot run transfers on CPUs %s (%s); they share "
                            "the model runner's", sorted(self.cpus), e)
        while True:
            item = self.q.get()
            try:
                if item is None:
                    return
                kind, job = item
                # vLLM's model-runner thread polls its queue in Python: with
                # the default 5 ms switch interval every GIL hand-off of the
                # copy loop waits up to 5 ms (a 64 MiB load took 0.5 s instead
                # of 20 ms); a short interval while a transfer runs
                old = sys.getswitchinterval()
                sys.setswitchinterval(min(old, 0.0002))
                try:
                    if kind == "load":
                        self._load(job)
                    else:
                        self._store(job)
                finally:
                    sys.setswitchinterval(old)
            except Exception as e:  # noqa: BLE001 - never kill the thread
                log.exception("kvtier worker: %s failed: %s", item[0], e)
            finally:
                self.q.task_done()

    def _record(self, rec):
        try:
            with open(self.cfg.stats_file, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError:
            pass

    def _load(self, job):
        L = self.layout
        loaded = 0
        t0 = time.perf_counter()
        c = self.conn.get()
        try:
            if c is None:
                raise ConnectionError("no kvtier server")
            if not self.cfg.same_chunk_size(c):   # restarted with another chunk size
                raise ValueError("the server's chunk size changed")
            rv = c.retrieve_view(self.cfg.keys(job.hashes, job.salt))
            t1, c1 = time.perf_counter(), time.thread_time()
            with rv as views:
                n = 0
                for i, mv in enumerate(views[:len(job.blocks)]):
                    dt, shape = rv.metas[i]
                    if len(mv) != L.chunk_bytes or not L.matches(dt, shape):
                        self.stats["layout_mismatch"] = self.stats.get("layout_mismatch", 0) + 1
                        break
                    n += 1
                L.scatter_many(zip(views[:n], job.blocks[:n]))
                t2, c2 = time.perf_counter(), time.thread_time()
                loaded = n
        except Exception as e:  # noqa: BLE001 - whatever was scattered is not trusted
            loaded = 0
            self.conn.failed(e, "load")
        if self.cfg.stats_file and loaded:
            self._record({"op": "load", "chunks": loaded, "bytes": loaded * L.chunk_bytes,
                          "seconds": time.perf_counter() - t0, "copy_seconds": t2 - t1,
                          # CPU time of this thread in the copy: below copy_seconds
                          # (one copy thread) when other threads share its core
                          "copy_thread_cpu_seconds": c2 - c1, "copy_threads": L.copy_threads})
        bad = set()
        for row in job.blocks[loaded:]:
            bad.update(b for b in row if b >= 0)
        with self.lock:
            self.stats["load_chunks"] = self.stats.get("load_chunks", 0) + loaded
            if bad:
                self.stats["load_failed_chunks"] = (self.stats.get("load_failed_chunks", 0)
                                                    + len(job.blocks) - loaded)
                self.load_errors |= bad
            self.done_recv.add(job.req_id)

    def _store(self, job):
        log.debug("kvtier worker: storing %d chunks of %s", len(job.hashes), job.req_id)
        L = self.layout
        try:
            c = self.conn.get()
            if c is None or not self.cfg.same_chunk_size(c):
                self.stats["store_skipped_chunks"] = self.stats.get("store_skipped_chunks", 0) + len(job.hashes)
                return
            keys = self.cfg.keys(job.hashes, job.salt)
            sv = c.store_view(keys, [L.chunk_bytes] * len(job.hashes), dtype=L.dtype_name,
                              shape=L.shape, blocks=job.engine)
            with sv as views:
                L.gather_many((blocks, v) for v, blocks in zip(views, job.blocks) if v is not None)
            self.stats["store_chunks"] = self.stats.get("store_chunks", 0) + len(job.hashes)
        except Exception as e:  # noqa: BLE001
            self.conn.failed(e, "store")
        finally:
            with self.lock:
                n = self.pending.get(job.req_id, 1) - 1
                if n <= 0:
                    self.pending.pop(job.req_id, None)
                else:
                    self.pending[job.req_id] = n


# ------------------------------------------------------------------ config


class _Config:
    def __init__(self, vllm_config, rank, world):
        kv = vllm_config.kv_transfer_config
        get = kv.get_from_extra_config
        self.url = get("url", "tcp://127.0.0.1:5555")
        mc = vllm_config.model_config
        served = getattr(mc, "served_model_name", None)
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        self.model = get("model_name", None) or served or mc.model
        self.timeout_ms = int(get("timeout_ms", 5000))
        self.retry_s = float(get("retry_s", 2.0))
        self.shm = bool(get("shm", True))
        self.auth_keys = (get("server_key", None), get("client_key", None))
        self.block_size = vllm_config.cache_config.block_size
        self.kv_rank = _kv_rank(world, rank)
        self.chunk_size = int(get("chunk_size", 256))
        ct = get("copy_threads", None)
        if ct is not None and (isinstance(ct, bool) or not isinstance(ct, int) or ct < 1):
            raise ValueError("kvtier connector: copy_threads must be a positive integer, got %r"
                             % (ct,))
        self.copy_threads = ct
        cc = get("copy_cpus", None)
        if cc is not None and cc != "inherit" and not (
                isinstance(cc, (list, tuple)) and cc
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in cc)):
            raise ValueError('kvtier connector: copy_cpus must be a non-empty list of CPU ids or '
                             '"inherit", got %r' % (cc,))
        self.copy_cpus = cc
        # benchmarks: one JSON line per load (chunks, bytes, seconds)
        self.stats_file = os.environ.get("KVTIER_VLLM_STATS")
        self.disabled = False
        self._check_chunk()

    def _check_chunk(self):
        if self.chunk_size <= 0 or self.chunk_size % self.block_size:
            raise ValueError(
                "kvtier connector: kvtier's chunk size (%d tokens) is not a multiple of vLLM's "
                "block size (%d); start kvtier with --chunk-size N*%d or vLLM with a --block-size "
                "that divides %d" % (self.chunk_size, self.block_size, self.block_size, self.chunk_size))
        self.blocks_per_chunk = self.chunk_size // self.block_size

    def set_chunk_size(self, n):
        if n and n != self.chunk_size:
            self.chunk_size = int(n)
            self._check_chunk()

    def same_chunk_size(self, c):
        """Whether client c's server still has this engine's chunk size; if
        not, this engine stops using kvtier (chunk_mismatch)."""
        if c.chunk_size != self.chunk_size:
            self.chunk_mismatch(c.chunk_size)
        return not self.disabled

    def chunk_mismatch(self, n):
        if not self.disabled:
            log.error("kvtier server at %s now has chunk size %d, this engine started with %d: "
                      "no loads or stores until vLLM restarts", self.url, n, self.chunk_size)
        self.disabled = True

    def keys(self, hashes, salt):
        return kvtier.Keys(self.model, hashes, kv_rank=self.kv_rank, salt=salt)


def _transfer_cpus(copy_cpus, kv_caches):
    """The CPUs the transfer thread runs on, or None to keep the CPUs it
    inherits from the model-runner thread.

    vLLM's CPU worker binds its model-runner thread (and so every thread it
    starts) to one core of its OpenMP list; that thread polls its message
    queue while a request waits for its load, so a transfer thread left there
    gets half a core. The transfer thread is let onto every core of vLLM's
    CPU topology (`current_platform.discover_numa_topology()`), so the
    kernel puts its copies wherever a core is free. vLLM's NIXL connector
    pins its transfer thread to the last core of each node instead (the one
    vLLM sets aside for KV transfer): on the 2-core VM that made a 64 MiB
    load 4-8x slower (bench/bench_vllm.py, 2026-12-02; docs/vllm.md), so
    this connector does it only when `copy_cpus` says so. GPU workers keep
    what they inherit: their copies are DMA."""
    if copy_cpus == "inherit":
        return None
    if copy_cpus is not None:
        return set(copy_cpus)
    dev = getattr(next(iter(kv_caches.values()), None), "device", None) if kv_caches else None
    if dev is None or dev.type != "cpu":
        return None
    try:
        from vllm.platforms import current_platform
        groups = current_platform.discover_numa_topology()
    except Exception:  # noqa: BLE001 - another platform or an older vLLM
        return None
    cpus = {c for g in groups or [] for c in g}
    try:
        online = set(range(os.cpu_count() or 0))
        cpus &= online
    except Exception:  # noqa: BLE001
        pass
    return cpus or None


def _check_kv_groups(kv_cache_config):
    if kv_cache_config is None:
        return
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) > 1:
        raise ValueError("kvtier connector: this model has %d KV cache groups (hybrid or "
                         "sliding-window layers); only models whose layers all use full "
                         "attention are supported" % len(groups))
    try:
        from vllm.v1.kv_cache_interface import FullAttentionSpec
    except ImportError:  # pragma: no cover
        return
    for g in groups:
        spec = g.kv_cache_spec
        if not isinstance(spec, FullAttentionSpec) or getattr(spec, "sliding_window", None):
            raise ValueError("kvtier connector: KV cache spec %s is not supported (full "
                             "attention and MLA only)" % type(spec).__name__)


# --------------------------------------------------------------- connector


class KvtierConnector(KVConnectorBase_V1):
    """vLLM v1 KV connector backed by a kvtier server (see the module doc)."""

    if CacheHitSource is not None:
        _cache_hit_source = getattr(CacheHitSource, "HOST", CacheHitSource.EXTERNAL_UNSPECIFIED)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a dropped store is only a future miss

    @classmethod
    def kv_cache_access(cls, kv_transfer_config):
        """vLLM >= 0.34: how the workers reach the device KV cache. In
        process only: loads and stores are torch ops on the KV tensors
        (index_select / index_copy_ on the device, one copy to or from the
        host pool, which is what `register_pinned` registers); the device
        KV cache is never registered with UCX/RDMA nor exported to another
        process, so any allocation works, vLLM's extensible KV cache
        included."""
        from vllm.config.kv_transfer import KVCacheAccess
        return KVCacheAccess.IN_PROCESS

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        """vLLM >= 0.33: sleep mode remaps the KV cache; the connector holds
        no registration of it (only the tensors, whose addresses stay), so it
        follows the remap: `unregister_kv_caches` waits for its transfers."""
        return True

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        _check_kv_groups(kv_cache_config)
        kv = vllm_config.kv_transfer_config
        policy = kv.get_from_extra_config("load_failure_policy", "recompute")
        if policy not in ("recompute", "fail"):
            raise ValueError('kvtier connector: "load_failure_policy" must be "recompute" or "fail"')
        kv.kv_load_failure_policy = policy
        world = vllm_config.parallel_config.tensor_parallel_size
        rank = 0
        if role == KVConnectorRole.WORKER:
            try:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
                rank = get_tensor_model_parallel_rank()
            except Exception:  # noqa: BLE001 - not initialised: single rank
                rank = 0
        self._cfg = _Config(vllm_config, rank, world)
        self._num_blocks = getattr(kv_cache_config, "num_blocks", None)
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _Scheduler(self._cfg)
            self._worker = None
        else:
            self._sched = None
            self._worker = _Worker(self._cfg)

    # ---- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        num_blocks = self._num_blocks
        if not num_blocks:
            t = next(iter(kv_caches.values()))
            num_blocks = t.shape[1] if t.shape[0] == 2 else t.shape[0]
        self._worker.register_kv_caches(kv_caches, num_blocks)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, KvtierMetadata) and meta.loads and not self._cfg.disabled:
            self._worker.start_load(meta)
        elif isinstance(meta, KvtierMetadata) and meta.loads:
            with self._worker.lock:
                for job in meta.loads:
                    for row in job.blocks:
                        self._worker.load_errors.update(b for b in row if b >= 0)
                    self._worker.done_recv.add(job.req_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        if isinstance(meta, KvtierMetadata) and meta.stores and not self._cfg.disabled:
            self._worker.save(meta)

    def unregister_kv_caches(self) -> None:
        # vLLM >= 0.33, before sleep frees the KV cache's memory: no copy of
        # the kvtier-io thread may touch it then (a store of a finished
        # request may still be queued). Nothing is registered; idempotent.
        if self._worker is not None:
            self._worker.drain()

    def restore_kv_caches(self) -> None:
        # vLLM >= 0.33, after wake-up: the same tensors at the same
        # addresses, nothing to redo
        return

    def handle_preemptions(self, kv_connector_metadata):
        # preempted requests' blocks may be reused next: finish what reads them
        self._worker.drain()

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._sched is not None:
            self._sched.shutdown()

    # ---- scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if self._cfg.disabled:
            return 0, False
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self._sched.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)
