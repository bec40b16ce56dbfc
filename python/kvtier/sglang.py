"""kvtier as an SGLang HiCache storage backend (the L3 tier of HiCache).

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
            "interface_v1": 1, "url": "tcp://127.0.0.1:5555"}'

SGLang's cache controller moves pages between its host KV pool (HiCache L2,
pinned host memory) and this backend. One kvtier object is one SGLang page
(`page_size` tokens of every layer of this rank), its bytes in the order of
the host pool's flat data page (`get_data_page(index, flat=True)`, what
SGLang's own file backend writes), tagged with dtype and page shape.

With `"interface_v1": 1` the controller calls batch_set_v1 / batch_get_v1
with host-pool indices: a store gathers each page from the host pool
straight into kvtier's shared-memory pool (`store_view`, one copy) and a load
copies each page from the pool into its host-pool slot (`retrieve_view`, one
copy), as kvtier's vLLM connector does. When the server is on another host
the same calls move the bytes inline in ZeroMQ frames. Without
`interface_v1` SGLang uses get/set/batch_get/batch_set with flat page
tensors (one more copy, inside SGLang).

Keys: kvtier.Keys(model, [page hash], kv_rank, salt). The hash is SGLang's
page hash (64 hex digits: its 32 bytes; anything else: SHA-256 of it). The
model part names the model and what makes a page's bytes differ: the host
pool layout, dtype and pipeline / context-parallel shard; kv_rank carries the
TP world size and rank (MLA pages are the same on every TP rank: world 1);
salt is the tenant (`tenant` in the extra config, or per call
`extra_info.extra_info["tenant"]`): different tenants never share an object.

Failure: kvtier down, slow or restarting means misses, never an exception
into SGLang's controller: batch_exists reports 0, gets report False (SGLang
recomputes), sets report False (the pages are simply not in L3). After a
failure the thread's client waits `retry_s` before reconnecting (a circuit
breaker: a dead server costs one timeout, not one per call). Each failure
is counted in `stats` and logged, rate-limited.

Extra config keys (`--hicache-storage-backend-extra-config`):
    url          kvtier server (default tcp://127.0.0.1:5555)
    model_name   the model part of the keys (default: SGLang's model name)
    tenant       the default salt of every key (default "")
    timeout_ms   per-request timeout (default 5000)
    retry_s      after a failure, how long before trying again (default 2)
    shm          false: never map the server's pool (inline frames only)
    max_batch_bytes  the most bytes one store_view / retrieve_view spans
                 (default 64 MiB; a batch is split below SGLang's 128 pages)
    server_key, client_key  CURVE authentication (docs/security.md)
Unknown keys (SGLang's own: backend_name, module_path, class_name,
interface_v1, ...) are ignored.
"""

import ctypes
import hashlib
import itertools
import logging
import threading
import time
import warnings

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

import kvtier
from kvtier.kvcopy import DTYPE_NAMES

log = logging.getLogger(__name__)

__all__ = ["KvtierStorage", "SUPPORTED_LAYOUTS"]

# Host pool layouts whose page is one strided view of the pool
# (get_data_page(i, flat=False)); page_unified, page_head-with-split-heads and
# the asymmetric pools have no such page and are refused.
SUPPORTED_LAYOUTS = {
    "MHATokenToKVPoolHost": ("layer_first", "page_first", "page_first_direct", "page_head"),
    "MLATokenToKVPoolHost": ("layer_first", "page_first", "page_first_direct"),
}

_FORBIDDEN_SALT = set("@/\\")


class _Conn:
    """One kvtier client per thread (kvtier.Client is not thread-safe and
    SGLang's hit-query, prefetch-IO and backup threads call concurrently).
    Reconnects by itself; never raises: after a failure it waits retry_s."""

    def __init__(self, owner):
        self.o = owner
        self.client = None
        self.down_until = 0.0

    def get(self):
        if self.o._closed:  # close() closed every thread's client
            self.client = None
            return None
        if self.client is not None:
            return self.client
        if time.monotonic() < self.down_until:
            return None
        o = self.o
        try:
            self.client = kvtier.Client(o.url, timeout_ms=o.timeout_ms, shm=o.shm,
                                        connect_timeout_ms=min(o.timeout_ms, 2000),
                                        server_key=o.auth_keys[0], client_key=o.auth_keys[1])
            with o._lock:
                o._clients.append(self.client)
            if o.stats.get("disconnects"):
                log.info("kvtier: connected to %s again", o.url)
        except Exception as e:  # noqa: BLE001 - any failure means "no L3 now"
            self.failed(e, "connect")
            return None
        return self.client

    def failed(self, exc, what):
        o = self.o
        with o._lock:
            o.stats["errors"] = o.stats.get("errors", 0) + 1
            if self.client is not None:
                o.stats["disconnects"] = o.stats.get("disconnects", 0) + 1
                if self.client in o._clients:
                    o._clients.remove(self.client)
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass
        self.client = None
        self.down_until = time.monotonic() + o.retry_s
        now = time.monotonic()
        if now - o._last_warn > 10.0:
            o._last_warn = now
            log.warning("kvtier: %s failed (%s); treated as a miss (errors so far: %d)",
                        what, exc, o.stats["errors"])


def _hash(key):
    """32 bytes for an SGLang page key: its hex digest, or a SHA-256 of it."""
    if len(key) == 64:
        try:
            return bytes.fromhex(key)
        except ValueError:
            pass
    return hashlib.sha256(key.encode()).digest()


def _check_salt(s, what):
    if not isinstance(s, str) or len(s.encode()) > 128 or any(
            c in _FORBIDDEN_SALT or ord(c) < 32 for c in s):
        raise ValueError("kvtier storage: %s must be a string of at most 128 bytes without "
                         "'@', '/', '\\' or control characters, got %r" % (what, s))
    return s


def _segments(page, limit=4096):
    """The contiguous pieces of a page view, as (offset from the view's first
    byte, offset in the object, bytes), in the object's (C) order; None when
    there are more than `limit` (then torch copies). The same for every page
    of a pool: a page is a slice of the pool at a fixed stride."""
    shape, stride, es = list(page.shape), list(page.stride()), page.element_size()
    k, run = len(shape), 1
    while k > 0 and (shape[k - 1] == 1 or stride[k - 1] == run):
        run *= shape[k - 1]
        k -= 1
    n = 1
    for d in shape[:k]:
        n *= d
    if n > limit:
        return None
    segs, obj = [], 0
    for ix in itertools.product(*(range(d) for d in shape[:k])):
        voff = sum(i * st for i, st in zip(ix, stride[:k])) * es
        if segs and segs[-1][0] + segs[-1][2] == voff:  # adjacent: one piece
            segs[-1] = (segs[-1][0], segs[-1][1], segs[-1][2] + run * es)
        else:
            segs.append((voff, obj, run * es))
        obj += run * es
    return segs


class KvtierStorage(HiCacheStorage):
    """HiCacheStorage over a kvtier server (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs=None):
        cfg = storage_config
        extra = dict(cfg.extra_config or {})
        self.config = cfg
        self.url = extra.get("url", "tcp://127.0.0.1:5555")
        self.timeout_ms = int(extra.get("timeout_ms", 5000))
        self.retry_s = float(extra.get("retry_s", 2.0))
        self.shm = bool(extra.get("shm", True))
        self.max_batch_bytes = int(extra.get("max_batch_bytes", 64 << 20))
        self.auth_keys = (extra.get("server_key"), extra.get("client_key"))
        self.tenant = _check_salt(extra.get("tenant", extra.get("salt", "")) or "", "tenant")
        model = extra.get("model_name") or cfg.model_name or "sglang"
        if getattr(cfg, "should_split_heads", False):
            raise ValueError("kvtier storage: split-head pages (--hicache-storage heterogeneous "
                             "TP, should_split_heads) are not supported")
        # What makes two ranks' pages differ besides the model: the shard.
        # MLA KV is replicated over TP: every TP rank shares one object.
        shard = []
        if cfg.pp_size > 1:
            shard.append("pp%d.%d" % (cfg.pp_rank, cfg.pp_size))
        if cfg.attn_cp_size > 1:
            shard.append("cp%d.%d" % (cfg.attn_cp_rank, cfg.attn_cp_size))
        if getattr(cfg, "dcp_size", 1) > 1:
            shard.append("dcp%d.%d.p%s" % (cfg.dcp_rank, cfg.dcp_size, cfg.logical_page_size))
        if cfg.is_mla_model:
            # other bytes than an MHA page of the same model name and layout
            shard.insert(0, "mla")
            self.kv_rank = kvtier.kv_rank(1, 0, 1, 0)
        else:
            if cfg.tp_size > 255 or cfg.tp_rank > 255:
                raise ValueError("kvtier storage: TP size %d above 255" % cfg.tp_size)
            self.kv_rank = kvtier.kv_rank(cfg.tp_size, cfg.tp_rank, cfg.tp_size, cfg.tp_rank)
            if getattr(cfg, "dp_rank", 0):
                shard.append("dp%d" % cfg.dp_rank)
        self._model_base = model.replace("@", "_")
        self._shard = shard
        self.model = None          # set once the host pool is known (layout, dtype)
        self.host_pool = None
        self.stats = {}
        self._lock = threading.Lock()
        self._clients = []
        self._local = threading.local()
        self._last_warn = 0.0
        self._closed = False
        if cfg.is_mla_model and not cfg.is_storage_writer:
            log.info("kvtier storage: MLA rank %d reads only (rank %d writes)", cfg.tp_rank,
                     cfg.dcp_rank)

    # ----------------------------------------------------------- host pool

    def register_mem_pool_host(self, mem_pool_host):
        """Called by SGLang's controller right after construction: refuses a
        host pool whose pages this backend cannot carry (clear message)."""
        cls = type(mem_pool_host).__name__
        layout = getattr(mem_pool_host, "layout", None)
        ok = None
        for base in type(mem_pool_host).__mro__:
            if base.__name__ in SUPPORTED_LAYOUTS:
                ok = SUPPORTED_LAYOUTS[base.__name__]
                break
        if ok is None or type(mem_pool_host).__name__.startswith("Asymmetric"):
            raise ValueError(
                "kvtier storage: host pool %s is not supported (supported: %s)"
                % (cls, ", ".join(SUPPORTED_LAYOUTS)))
        if layout not in ok:
            raise ValueError(
                "kvtier storage: host pool layout %r of %s is not supported; use "
                "--hicache-mem-layout %s" % (layout, cls, " or ".join(ok)))
        if mem_pool_host.dtype not in DTYPE_NAMES and mem_pool_host.dtype.itemsize != 1:
            raise ValueError("kvtier storage: KV dtype %s is not supported" % mem_pool_host.dtype)
        super().register_mem_pool_host(mem_pool_host)
        self.host_pool = mem_pool_host
        self.page_size = mem_pool_host.page_size
        page = mem_pool_host.get_data_page(0, flat=False)
        self.page_shape = tuple(page.shape)
        self.dtype = mem_pool_host.dtype
        # the object's dtype (kvtier knows float16/bfloat16/float32; one-byte
        # formats travel as uint8): the exact torch dtype is in the model name
        self.dtype_name = DTYPE_NAMES.get(self.dtype, "uint8")
        self.page_bytes = page.numel() * page.element_size()
        self.segments = _segments(page)
        name = "%s#sglang.%s.%s" % (self._model_base, layout,
                                    str(self.dtype).replace("torch.", ""))
        if self._shard:
            name += "." + ".".join(self._shard)
        if len(name.encode()) > 128:  # kvtier's max_model_bytes
            name = name.encode()[:95].decode(errors="ignore") + "#" + \
                hashlib.sha256(name.encode()).hexdigest()[:32]
        self.model = name
        self.pages_per_batch = max(1, min(128, self.max_batch_bytes // max(1, self.page_bytes)))

    # ----------------------------------------------------------------- keys

    def _salt(self, extra_info):
        x = getattr(extra_info, "extra_info", None) if extra_info is not None else None
        if isinstance(x, dict):
            t = x.get("tenant", x.get("salt"))
            if t is not None:
                return _check_salt(t, "tenant")
        return self.tenant

    def _keys(self, keys, extra_info=None):
        if self.model is None:
            raise RuntimeError("kvtier storage: no host pool registered")
        return kvtier.Keys(self.model, [_hash(k) for k in keys], kv_rank=self.kv_rank,
                           salt=self._salt(extra_info))

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = _Conn(self)
        return c

    def _count(self, name, n):
        with self._lock:
            self.stats[name] = self.stats.get(name, 0) + n

    def _page(self, host_indices, i):
        return self.host_pool.get_data_page(int(host_indices[i * self.page_size]), flat=False)

    def _as_page(self, mv):
        """A uint8 memoryview of one object as a tensor of the page's shape."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only buffers: only read from here
            t = torch.frombuffer(mv, dtype=torch.uint8)
        return t.view(self.dtype).view(self.page_shape)

    def _to_object(self, page, mv):
        """Page (a view of the host pool) -> object bytes (a writable pool view)."""
        if self.segments is None:
            self._as_page(mv).copy_(page)
            return
        src, dst = page.data_ptr(), self._as_page(mv).data_ptr()
        for voff, ooff, n in self.segments:
            ctypes.memmove(dst + ooff, src + voff, n)  # releases the GIL

    def _from_object(self, mv, page):
        if self.segments is None:
            page.copy_(self._as_page(mv))
            return
        src, dst = self._as_page(mv).data_ptr(), page.data_ptr()
        for voff, ooff, n in self.segments:
            ctypes.memmove(dst + voff, src + ooff, n)

    def _matches(self, mv, meta):
        return len(mv) == self.page_bytes and (
            meta is None or (meta[0] == self.dtype_name and tuple(meta[1]) == self.page_shape))

    # ------------------------------------------------------- zero-copy (v1)

    def _batched(self, name, op, keys, host_indices, extra_info, leading_run):
        """Checks the host indices, then runs op(keys, host_indices, first,
        extra_info) over batches of pages_per_batch; with leading_run, stops
        at the first page op did not do (SGLang uses the leading run only)."""
        n = len(keys)
        if n == 0:
            return []
        if host_indices is None or len(host_indices) < n * self.page_size:
            log.error("kvtier storage: %s got %s host indices for %d pages", name,
                      None if host_indices is None else len(host_indices), n)
            return [False] * n
        host_indices = host_indices.cpu()
        res = []
        for s in range(0, n, self.pages_per_batch):
            r = op(keys[s:s + self.pages_per_batch], host_indices, s, extra_info)
            res += r
            if leading_run and not all(r):
                return res + [False] * (n - len(res))
        return res

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        return self._batched("batch_set_v1", self._set_batch, keys, host_indices, extra_info,
                             leading_run=False)

    def _set_batch(self, keys, host_indices, first, extra_info):
        n = len(keys)
        conn = self._conn()
        c = conn.get()
        if c is None:
            self._count("set_skipped_pages", n)
            return [False] * n
        try:
            sv = c.store_view(self._keys(keys, extra_info), [self.page_bytes] * n,
                              dtype=self.dtype_name, shape=self.page_shape)
            with sv as views:
                for i, v in enumerate(views):
                    if v is not None:  # None: kvtier has this page already
                        self._to_object(self._page(host_indices, first + i), v)
            self._count("set_pages", n)
            return [True] * n
        except Exception as e:  # noqa: BLE001
            conn.failed(e, "store")
            self._count("set_failed_pages", n)
            return [False] * n

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        return self._batched("batch_get_v1", self._get_batch, keys, host_indices, extra_info,
                             leading_run=True)

    def _get_batch(self, keys, host_indices, first, extra_info):
        n = len(keys)
        conn = self._conn()
        c = conn.get()
        if c is None:
            self._count("get_skipped_pages", n)
            return [False] * n
        got = 0
        try:
            rv = c.retrieve_view(self._keys(keys, extra_info))
            with rv as views:
                for i, mv in enumerate(views[:n]):
                    if not self._matches(mv, rv.metas[i]):
                        self._count("layout_mismatch", 1)
                        break
                    self._from_object(mv, self._page(host_indices, first + i))
                    got += 1
            # the read lease held to the end: the copied bytes are good
        except Exception as e:  # noqa: BLE001 - whatever was copied is not trusted
            conn.failed(e, "load")
            self._count("get_failed_pages", n)
            return [False] * n
        self._count("get_pages", got)
        return [True] * got + [False] * (n - got)

    def batch_exists(self, keys, extra_info=None):
        if not keys or self.model is None:
            return 0
        conn = self._conn()
        c = conn.get()
        if c is None:
            return 0
        try:
            return int(c.lookup(self._keys(keys, extra_info)))
        except Exception as e:  # noqa: BLE001
            conn.failed(e, "lookup")
            return 0

    # ------------------------------------------ generic (flat page tensors)

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        r = self.batch_get([key], [target_location] if target_location is not None else None)
        return r[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        n = len(keys)
        out = [None] * n
        if n == 0 or self.model is None:
            return out
        conn = self._conn()
        c = conn.get()
        if c is None:
            return out
        try:
            rv = c.retrieve_view(self._keys(keys))
            with rv as views:
                for i, mv in enumerate(views[:n]):
                    if not self._matches(mv, rv.metas[i]):
                        self._count("layout_mismatch", 1)
                        break
                    src = self._as_page(mv).reshape(-1)
                    dst = target_locations[i] if target_locations else None
                    if dst is None:
                        out[i] = src.clone()
                    else:
                        dst.view(-1).copy_(src.view(dst.dtype) if dst.dtype != src.dtype else src)
                        out[i] = dst
        except Exception as e:  # noqa: BLE001
            conn.failed(e, "load")
            return [None] * n
        self._count("get_pages", sum(x is not None for x in out))
        return out

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value])

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        n = len(keys)
        if n == 0:
            return True
        if self.model is None or values is None or len(values) != n:
            return False
        conn = self._conn()
        c = conn.get()
        if c is None:
            return False
        try:
            flat = [v.contiguous().view(-1) for v in values]
            sizes = [t.numel() * t.element_size() for t in flat]
            sv = c.store_view(self._keys(keys), sizes, dtype=self.dtype_name,
                              shape=self.page_shape)
            with sv as views:
                for v, t in zip(views, flat):
                    if v is not None:
                        torch.frombuffer(v, dtype=torch.uint8).copy_(t.view(torch.uint8))
            self._count("set_pages", n)
            return True
        except Exception as e:  # noqa: BLE001
            conn.failed(e, "store")
            return False

    # ----------------------------------------------------------------- misc

    def clear(self):
        """kvtier's objects outlive this engine; clearing them is an admin
        operation (`kvtier clear`, docs/operations.md), not done from here."""
        log.info("kvtier storage: clear() leaves kvtier's objects in place (use `kvtier clear`)")
        return False

    def get_stats(self):
        return None

    def close(self):
        """Closes every thread's client; later calls are misses."""
        with self._lock:
            self._closed = True
            clients, self._clients = self._clients, []
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
