"""kvtier Python client: a thin ctypes binding over libkvtier_client.so.

    import kvtier
    c = kvtier.Client("tcp://127.0.0.1:5555")
    keys = kvtier.chunk_keys("my-model", tokens, chunk_size=256)
    c.store(keys, payloads)        # bytes-like, one per key -> number accepted
    c.flush()                      # every earlier store reached every L2 adapter or
                                   # failed there: a FlushResult lists what did not
    n = c.lookup(keys)             # leading chunks available (L2 hits pulled into L1)
    data = c.retrieve(keys[:n])    # list of read-only memoryviews (bytes-like),
                                   # identical to what was stored
    c.status()                     # dict

Only the standard library is used. On the same host the client maps the
server's shared-memory pool and moves bytes through it; store_view() and
retrieve_view() expose the pool as memoryviews so numpy/torch tensors can be
copied in and out without extra copies. store() copies each payload once,
from the caller's buffer into the pool; retrieve() copies each object once,
from the pool into a buffer the client owns and reuses (see retrieve()).
"""

import collections
import ctypes
import ctypes.util
import hashlib
import json
import os
import sys
from array import array

__all__ = [
    "Client",
    "FlushFailure",
    "FlushResult",
    "Keys",
    "KvtierError",
    "chunk_hashes",
    "chunk_keys",
    "kv_rank",
]

HASH_LEN = 32


# --------------------------------------------------------------------- keys


def chunk_hashes(tokens, chunk_size=256):
    """Prefix-chained SHA-256 hashes, one per full chunk of tokens.

    h_0 = SHA256(32 zero bytes || tokens[0:C] as big-endian u32)
    h_i = SHA256(h_{i-1}      || tokens[iC:(i+1)C] as big-endian u32)
    """
    if chunk_size <= 0:
        raise ValueError("chunk_size must be > 0")
    toks = array("I", tokens)
    if toks.itemsize != 4:
        raise RuntimeError("array('I') is not 32-bit on this platform")
    if sys.byteorder == "little":
        toks.byteswap()
    raw = toks.tobytes()
    step = chunk_size * 4
    prev = bytes(32)
    out = []
    for i in range(len(toks) // chunk_size):
        prev = hashlib.sha256(prev + raw[i * step:(i + 1) * step]).digest()
        out.append(prev)
    return out


def kv_rank(world_size=1, global_rank=0, local_world_size=1, local_rank=0):
    """LMCache's kv_rank encoding."""
    return (world_size << 24) | (global_rank << 16) | (local_world_size << 8) | local_rank


class Keys:
    """A batch of chunk keys sharing (model, kv_rank, group, salt)."""

    __slots__ = ("model", "kv_rank", "group", "salt", "hashes")

    def __init__(self, model, hashes, kv_rank=0, group=0, salt=""):
        if not isinstance(model, str) or not model:
            raise ValueError("model must be a non-empty string")
        self.model = model
        self.kv_rank = int(kv_rank)
        self.group = int(group)
        self.salt = salt or ""
        self.hashes = [bytes(h) for h in hashes]
        for h in self.hashes:
            if not 1 <= len(h) <= 32 or len(h) != len(self.hashes[0]):
                raise ValueError("hashes must all have the same length, 1..32 bytes")

    def __len__(self):
        return len(self.hashes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Keys(self.model, self.hashes[i], self.kv_rank, self.group, self.salt)
        return Keys(self.model, [self.hashes[i]], self.kv_rank, self.group, self.salt)

    def __iter__(self):
        for i in range(len(self.hashes)):
            yield self[i]

    def __repr__(self):
        return "Keys(%r, n=%d, kv_rank=%#x, group=%d, salt=%r)" % (
            self.model, len(self), self.kv_rank, self.group, self.salt)


def chunk_keys(model, tokens, chunk_size=256, kv_rank=0, group=0, salt=""):
    """One key per full chunk of tokens, with prefix-chained hashes."""
    return Keys(model, chunk_hashes(tokens, chunk_size), kv_rank, group, salt)


# ------------------------------------------------------------------ library


class _CKeys(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("kv_rank", ctypes.c_uint32),
        ("group", ctypes.c_uint32),
        ("salt", ctypes.c_char_p),
        ("hashes", ctypes.c_char_p),
        ("hash_len", ctypes.c_size_t),
        ("n", ctypes.c_size_t),
    ]


class _CMeta(ctypes.Structure):
    _fields_ = [
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint8),
        ("shape", ctypes.c_uint32 * 6),
    ]


class _CBlocks(ctypes.Structure):
    _fields_ = [
        ("block_size", ctypes.c_uint32),
        ("per_key", ctypes.c_uint32),
        ("hash_len", ctypes.c_uint32),
        ("hashes", ctypes.c_void_p),
        ("ints", ctypes.POINTER(ctypes.c_uint64)),
        ("has_parent", ctypes.c_bool),
        ("parent", ctypes.c_void_p),
        ("parent_int", ctypes.c_uint64),
        ("tokens_per_key", ctypes.c_uint32),
        ("tokens", ctypes.POINTER(ctypes.c_uint32)),
    ]


def _cblocks(blocks, nkeys, keep):
    """A kvt_blocks for the C library from blocks = {"size": tokens per
    block, "hashes": [bytes | int, ...] (the same number per key, in key
    order), "parent": bytes | int | None, "tokens": [int, ...] | None};
    None: none. keep holds the buffers the struct points into."""
    if blocks is None:
        return None
    hashes = list(blocks["hashes"])
    if nkeys == 0 or not hashes or len(hashes) % nkeys:
        raise ValueError("blocks: the same number of hashes (1..64) for each key")
    b = _CBlocks()
    b.block_size = int(blocks["size"])
    b.per_key = len(hashes) // nkeys
    parent = blocks.get("parent")
    if all(isinstance(h, int) for h in hashes):
        arr = (ctypes.c_uint64 * len(hashes))(*hashes)
        keep.append(arr)
        b.hash_len = 0
        b.ints = arr
        if parent is not None:
            b.has_parent = True
            b.parent_int = int(parent)
    else:
        hashes = [bytes(h) for h in hashes]
        hl = len(hashes[0])
        if any(len(h) != hl for h in hashes):
            raise ValueError("blocks: hashes of one length")
        buf = ctypes.create_string_buffer(b"".join(hashes), len(hashes) * hl)
        keep.append(buf)
        b.hash_len = hl
        b.hashes = ctypes.cast(buf, ctypes.c_void_p)
        if parent is not None:
            pb = ctypes.create_string_buffer(bytes(parent), len(parent))
            keep.append(pb)
            b.has_parent = True
            b.parent = ctypes.cast(pb, ctypes.c_void_p)
    toks = blocks.get("tokens")
    if toks:
        toks = list(toks)
        if len(toks) % nkeys:
            raise ValueError("blocks: the same number of tokens for each key")
        tarr = (ctypes.c_uint32 * len(toks))(*toks)
        keep.append(tarr)
        b.tokens_per_key = len(toks) // nkeys
        b.tokens = tarr
    return b


class _CBlob(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("dtype", ctypes.c_char * 16),
        ("ndim", ctypes.c_uint8),
        ("shape", ctypes.c_uint32 * 6),
        ("priv", ctypes.c_void_p),
    ]


class _CWView(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_size_t),
        ("ptrs", ctypes.POINTER(ctypes.c_void_p)),
        ("sizes", ctypes.POINTER(ctypes.c_size_t)),
        ("lease", ctypes.c_uint64),
    ]


class _CRView(ctypes.Structure):
    _fields_ = [
        ("n", ctypes.c_size_t),
        ("ptrs", ctypes.POINTER(ctypes.c_void_p)),
        ("lens", ctypes.POINTER(ctypes.c_size_t)),
        ("meta", ctypes.POINTER(_CBlob)),
        ("lease", ctypes.c_uint64),
    ]


class _CFlushFailure(ctypes.Structure):
    _fields_ = [
        ("adapter", ctypes.c_int),
        ("code", ctypes.c_int),
        ("kv_rank", ctypes.c_uint32),
        ("group", ctypes.c_uint32),
        ("hash", ctypes.c_uint8 * 32),
        ("hash_len", ctypes.c_size_t),
        ("model", ctypes.c_char * 256),
        ("salt", ctypes.c_char * 256),
    ]


class _CFlushReport(ctypes.Structure):
    _fields_ = [
        ("l2_failed", ctypes.c_uint64),
        ("n", ctypes.c_size_t),
        ("failed", ctypes.POINTER(_CFlushFailure)),
        ("truncated", ctypes.c_bool),
    ]


class FlushFailure(collections.namedtuple(
        "FlushFailure", "adapter code error model kv_rank group salt hash")):
    """One key of a store that did not reach L2 adapter `adapter` (its index)."""


class FlushResult:
    """What Client.flush() returns: l2_failed counts the (key, adapter) pairs
    of this client's stores since its previous flush that did not reach L2
    (each reported once); failed lists them (FlushFailure, at most 1024);
    truncated says the list is cut. Falsy when everything reached L2."""

    def __init__(self, l2_failed=0, failed=(), truncated=False):
        self.l2_failed = l2_failed
        self.failed = list(failed)
        self.truncated = truncated

    def __bool__(self):
        return self.l2_failed > 0

    def __repr__(self):
        return "FlushResult(l2_failed=%d, failed=%r, truncated=%r)" % (
            self.l2_failed, self.failed, self.truncated)


class _COpts(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_int), ("no_shm", ctypes.c_bool), ("no_local", ctypes.c_bool),
                ("connect_timeout_ms", ctypes.c_int),
                ("server_key", ctypes.c_char_p), ("client_key", ctypes.c_char_p)]


def _pkg_config_library():
    """libkvtier_client.so.0 in the libdir kvtier.pc names, or None."""
    import subprocess
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "kvtier"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = r.stdout.strip()
    if r.returncode or not libdir:
        return None
    for name in ("libkvtier_client.so.0", "libkvtier_client.so"):
        cand = os.path.join(libdir, name)
        if os.path.exists(cand):
            return cand
    return None


def _find_library():
    """Where libkvtier_client is: KVTIER_LIB, a copy next to this module, the
    tree's build/ (a checkout), pkg-config's libdir for kvtier (make install,
    the Debian package), then the dynamic linker's search path."""
    env = os.environ.get("KVTIER_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (
        os.path.join(here, "libkvtier_client.so"),
        os.path.join(here, "..", "..", "build", "libkvtier_client.so"),
    ):
        if os.path.exists(cand):
            return os.path.abspath(cand)
    found = _pkg_config_library() or ctypes.util.find_library("kvtier_client")
    if found:
        return found
    raise ImportError("libkvtier_client.so not found: run `make` (or `make install`, or install "
                      "the kvtier package), or set KVTIER_LIB to its path")


_lib = None


def _L():
    global _lib
    if _lib is not None:
        return _lib
    path = _find_library()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError("cannot load the kvtier C library %s (%s): rebuild it (`make`) or "
                          "point KVTIER_LIB at libkvtier_client.so" % (path, e)) from None
    P = ctypes.POINTER
    vp = ctypes.c_void_p
    sz = ctypes.c_size_t
    lib.kvt_client_open.argtypes = [ctypes.c_char_p, P(_COpts), P(vp)]
    lib.kvt_client_open_error.argtypes = []
    lib.kvt_client_open_error.restype = ctypes.c_char_p
    lib.kvt_client_close.argtypes = [vp]
    lib.kvt_client_last_error.argtypes = [vp]
    lib.kvt_client_last_error.restype = ctypes.c_char_p
    lib.kvt_client_shm_active.argtypes = [vp]
    lib.kvt_client_shm_active.restype = ctypes.c_bool
    lib.kvt_client_pool.argtypes = [vp, P(vp), P(sz)]
    lib.kvt_client_pool.restype = ctypes.c_bool
    lib.kvt_client_chunk_size.argtypes = [vp]
    lib.kvt_client_local_active.argtypes = [vp]
    lib.kvt_client_local_active.restype = ctypes.c_bool
    lib.kvt_store.argtypes = [vp, P(_CKeys), P(vp), P(sz), P(_CMeta), P(sz)]
    lib.kvt_store_ex.argtypes = [vp, P(_CKeys), P(vp), P(sz), P(_CMeta), P(_CBlocks), P(sz)]
    lib.kvt_flush.argtypes = [vp]
    lib.kvt_flush_ex.argtypes = [vp, P(_CFlushReport)]
    lib.kvt_flush_report_free.argtypes = [P(_CFlushReport)]
    lib.kvt_ping.argtypes = [vp]
    lib.kvt_lookup.argtypes = [vp, P(_CKeys), P(sz)]
    lib.kvt_free_locks.argtypes = [vp]
    lib.kvt_retrieve.argtypes = [vp, P(_CKeys), P(P(_CBlob)), P(sz)]
    lib.kvt_blobs_free.argtypes = [P(_CBlob), sz]
    lib.kvt_store_begin.argtypes = [vp, P(_CKeys), P(sz), P(_CMeta), P(P(_CWView))]
    lib.kvt_store_begin_ex.argtypes = [vp, P(_CKeys), P(sz), P(_CMeta), P(_CBlocks),
                                       P(P(_CWView))]
    lib.kvt_store_commit.argtypes = [vp, P(_CWView), P(ctypes.c_bool), P(sz)]
    lib.kvt_store_abort.argtypes = [vp, P(_CWView)]
    lib.kvt_retrieve_begin.argtypes = [vp, P(_CKeys), P(P(_CRView))]
    lib.kvt_retrieve_end.argtypes = [vp, P(_CRView)]
    lib.kvt_status_json.argtypes = [vp, P(ctypes.c_char_p)]
    lib.kvt_delete.argtypes = [vp, P(_CKeys), P(sz)]
    lib.kvt_strerror.argtypes = [ctypes.c_int]
    lib.kvt_strerror.restype = ctypes.c_char_p
    lib.kvt_errname.argtypes = [ctypes.c_int]
    lib.kvt_errname.restype = ctypes.c_char_p
    _lib = lib
    return lib


_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]

E_UNSUPPORTED = -1011


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer: the address of a read-only buffer without a copy."""
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_api = getattr(ctypes, "pythonapi", None)
if _api is not None:
    _api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    _api.PyObject_GetBuffer.restype = ctypes.c_int
    _api.PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
    _api.PyBuffer_Release.restype = None
    _api.PyByteArray_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
    _api.PyByteArray_FromStringAndSize.restype = ctypes.py_object
    _api.PyByteArray_AsString.argtypes = [ctypes.py_object]
    _api.PyByteArray_AsString.restype = ctypes.c_void_p


def _new_buffer(n):
    """A bytearray of n bytes, not zero-filled (the copy writes every byte):
    one pass over fresh memory instead of two. Returns (buffer, address).
    Made one byte longer and cut back, so that _idle()'s append fits in
    what is allocated (no realloc, no move)."""
    if _api is not None:
        b = _api.PyByteArray_FromStringAndSize(None, n + 1)
    else:
        b = bytearray(n + 1)
    del b[-1]
    return b, _addr(b)


def _addr(b):
    if _api is not None:
        return _api.PyByteArray_AsString(b)
    if not len(b):
        return 0
    a = (ctypes.c_char * len(b)).from_buffer(b)
    addr = ctypes.addressof(a)
    del a  # its export would make the buffer look busy
    return addr


def _idle(b):
    """True when no memoryview of b is alive (nobody holds a result in it):
    a bytearray with exported buffers refuses to change size."""
    try:
        b.append(0)
    except BufferError:
        return False
    b.pop()
    return True


_ALIGN = 64      # each object of a retrieve starts on a cache line (and tensor alignment)
_SMALL = 1 << 20  # results below this total get a buffer of their own, never reused


class KvtierError(Exception):
    """A kvtier call failed; .code is the negative error code, .name its symbol."""

    def __init__(self, code, message):
        self.code = code
        self.name = _L().kvt_errname(code).decode()
        super().__init__("%s (%d): %s" % (self.name, code, message))


# ------------------------------------------------------------------- client


def _ckeys(keys):
    if not isinstance(keys, Keys):
        raise TypeError("keys must be kvtier.Keys (see kvtier.chunk_keys)")
    hl = len(keys.hashes[0]) if keys.hashes else HASH_LEN
    k = _CKeys(
        keys.model.encode(), keys.kv_rank, keys.group, keys.salt.encode(),
        b"".join(keys.hashes), hl, len(keys.hashes))
    return k


def _cmeta(dtype, shape):
    if dtype is None and not shape:
        return None
    m = _CMeta()
    m.dtype = dtype.encode() if dtype else None
    shape = list(shape or [])
    if len(shape) > 6:
        raise ValueError("shape has at most 6 dimensions")
    m.ndim = len(shape)
    for i, d in enumerate(shape):
        m.shape[i] = int(d)
    return m


def _buffer_ptr(obj, keep, views):
    """Address and length of a bytes-like object, without copying it (also
    when it is read-only). Buffers taken here go to views: release them
    with _release() once the library is done with the addresses."""
    if isinstance(obj, bytes):
        keep.append(obj)
        return ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value, len(obj)
    mv = memoryview(obj)
    if not mv.c_contiguous:
        raise ValueError("payloads must be C-contiguous")
    keep.append(mv)
    if mv.nbytes == 0:
        return ctypes.cast(ctypes.c_char_p(b""), ctypes.c_void_p).value, 0
    if _api is not None:
        pb = _PyBuffer()
        _api.PyObject_GetBuffer(mv, ctypes.byref(pb), 0)  # PyBUF_SIMPLE: raises on error
        views.append(pb)
        return pb.buf, pb.len
    mv = mv.cast("B")
    if mv.readonly:  # no C API to reach the bytes: one copy
        b = mv.tobytes()
        keep.append(b)
        return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value, len(b)
    arr = (ctypes.c_char * len(mv)).from_buffer(mv)
    keep.append((mv, arr))
    return ctypes.addressof(arr), len(mv)


def _release(views):
    for pb in views:
        _api.PyBuffer_Release(ctypes.byref(pb))
    views.clear()


class _StoreView:
    def __init__(self, client, view):
        self._c = client
        self._v = view
        n = view.contents.n
        self.views = []
        for i in range(n):
            p = view.contents.ptrs[i]
            if p:
                size = view.contents.sizes[i]
                self.views.append(memoryview((ctypes.c_char * size).from_address(p)).cast("B"))
            else:
                self.views.append(None)  # the server already has this key

    def __enter__(self):
        return self.views

    def __exit__(self, exc_type, exc, tb):
        v, self._v = self._v, None
        self.views = []
        if v is None:
            return False
        if exc_type is not None:
            _L().kvt_store_abort(self._c._h, v)
            return False
        acc = ctypes.c_size_t()
        self._c._check(_L().kvt_store_commit(self._c._h, v, None, ctypes.byref(acc)))
        self.accepted = acc.value
        return False


class _RetrieveView:
    def __init__(self, client, view):
        self._c = client
        self._v = view
        self.views = []
        self.metas = []
        for i in range(view.contents.n):
            p = view.contents.ptrs[i]
            size = view.contents.lens[i]
            mv = memoryview((ctypes.c_char * size).from_address(p)).cast("B").toreadonly()
            self.views.append(mv)
            m = view.contents.meta[i]
            self.metas.append((m.dtype.decode(), tuple(m.shape[: m.ndim])))

    def __enter__(self):
        return self.views

    def __exit__(self, exc_type, exc, tb):
        v, self._v = self._v, None
        for mv in self.views:
            mv.release()
        self.views = []
        if v is not None:
            rc = _L().kvt_retrieve_end(self._c._h, v)
            if rc and exc_type is None:
                self._c._check(rc)
        return False


class Client:
    """A connection to one kvtier server. Not thread-safe: one per thread."""

    def __init__(self, url="tcp://127.0.0.1:5555", timeout_ms=30000, shm=True, local=True,
                 connect_timeout_ms=2000, keep_buffers=2, server_key=None, client_key=None):
        """url: tcp://host:port or ipc:///path.

        timeout_ms: per request. connect_timeout_ms: the connection and the
        first "hello"; nobody listening at url (connection refused, no
        socket file) is reported at once as "no server at URL"
        (ECONNREFUSED / ENOENT), a host or listener that does not answer
        within connect_timeout_ms as E_TIMEOUT.

        shm: move bytes through the server's shared-memory pool when it is
        on this host; local: send requests over its same-host Unix socket.
        Both fall back to ZeroMQ frames automatically.

        keep_buffers: how many result buffers of retrieve() the client keeps
        for reuse once their results are dropped (0: a fresh one each call).

        server_key, client_key: CURVE authentication (docs/security.md):
        the file with the server's public key (its NAME.pub) and the file
        with this client's secret key (NAME.key, mode 0600). Both or
        neither; None takes $KVTIER_SERVER_KEY and $KVTIER_CLIENT_KEY.
        """
        lib = _L()
        self._h = None
        self._bufs = []
        self._keep = max(0, int(keep_buffers))
        h = ctypes.c_void_p()
        opts = _COpts(timeout_ms, not shm, not local, connect_timeout_ms,
                      os.fsencode(server_key) if server_key else None,
                      os.fsencode(client_key) if client_key else None)
        rc = lib.kvt_client_open(url.encode(), ctypes.byref(opts), ctypes.byref(h))
        if rc:
            why = lib.kvt_client_open_error().decode(errors="replace")
            raise KvtierError(rc, why or "cannot connect to %s: %s" % (url, lib.kvt_strerror(rc).decode()))
        self._h = h
        self.url = url

    def _check(self, rc):
        if rc:
            raise KvtierError(rc, _L().kvt_client_last_error(self._h).decode(errors="replace"))

    @property
    def shm_active(self):
        """True when bytes move through the server's shared-memory pool."""
        return bool(_L().kvt_client_shm_active(self._h))

    @property
    def pool(self):
        """(address, size) of the mapped L1 pool, or None without shared memory."""
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        if not _L().kvt_client_pool(self._h, ctypes.byref(base), ctypes.byref(size)):
            return None
        return base.value, size.value

    @property
    def local_active(self):
        """True when requests go over the same-host Unix socket."""
        return bool(_L().kvt_client_local_active(self._h))

    @property
    def chunk_size(self):
        return _L().kvt_client_chunk_size(self._h)

    def close(self):
        self._bufs = []  # results handed out keep their own buffer alive
        if self._h:
            _L().kvt_client_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def store(self, keys, payloads, dtype=None, shape=None, blocks=None):
        """Store one payload per key; returns how many keys the server holds now.

        blocks: the engine's block hashes of the keys, which the server's KV
        events name the chunks by (docs/events.md): {"size": tokens per
        block, "hashes": [bytes | int, ...] (as many for each key, in key
        order), "parent": the block before the first key's first (or None),
        "tokens": the blocks' token ids (as many for each key) or None}."""
        payloads = list(payloads)
        if len(payloads) != len(keys):
            raise ValueError("one payload per key (%d keys, %d payloads)" % (len(keys), len(payloads)))
        keep, views = [], []
        n = len(payloads)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        lens = (ctypes.c_size_t * max(n, 1))()
        try:
            for i, p in enumerate(payloads):
                ptrs[i], lens[i] = _buffer_ptr(p, keep, views)
            acc = ctypes.c_size_t()
            ck = _ckeys(keys)
            meta = _cmeta(dtype, shape)
            cb = _cblocks(blocks, len(keys), keep)
            # the library copies each payload once: into the pool (shared
            # memory), or onto the socket (inline)
            self._check(_L().kvt_store_ex(self._h, ctypes.byref(ck), ptrs, lens,
                                          ctypes.byref(meta) if meta else None,
                                          ctypes.byref(cb) if cb else None, ctypes.byref(acc)))
        finally:
            _release(views)
        return acc.value

    def flush(self, check=False):
        """Return once every earlier store of this client reached every L2
        adapter (or failed there; other clients' stores are not waited for),
        as a FlushResult naming the keys of this client's stores that did not
        reach an adapter since its previous flush (falsy when none).
        check=True raises KvtierError (the first failure's code) instead."""
        rep = _CFlushReport()
        self._check(_L().kvt_flush_ex(self._h, ctypes.byref(rep)))
        try:
            failed = []
            for i in range(rep.n):
                f = rep.failed[i]
                failed.append(FlushFailure(
                    f.adapter, f.code, _L().kvt_errname(f.code).decode(),
                    f.model.decode(errors="replace"), f.kv_rank, f.group,
                    f.salt.decode(errors="replace"), bytes(f.hash[:f.hash_len])))
            res = FlushResult(rep.l2_failed, failed, rep.truncated)
        finally:
            _L().kvt_flush_report_free(ctypes.byref(rep))
        if check and res.l2_failed:
            code = failed[0].code if failed else -5  # -EIO when none is listed
            raise KvtierError(code, "%d store(s) did not reach L2 (first: %s)" % (
                res.l2_failed, failed[0] if failed else "not listed"))
        return res

    def ping(self):
        self._check(_L().kvt_ping(self._h))

    def lookup(self, keys):
        """Number of leading keys available; read locks are held until retrieve."""
        n = ctypes.c_size_t()
        ck = _ckeys(keys)
        self._check(_L().kvt_lookup(self._h, ctypes.byref(ck), ctypes.byref(n)))
        return n.value

    def free_locks(self):
        self._check(_L().kvt_free_locks(self._h))

    def _buffer(self, need):
        """A buffer of at least need bytes for one retrieve's results: an
        idle kept one when one fits (its pages are mapped already: a copy
        into fresh pages costs several times a copy into mapped ones), else
        a new one, kept for later calls."""
        if need < _SMALL or not self._keep:
            return _new_buffer(need)
        best = None
        for i, b in enumerate(self._bufs):
            if need <= len(b) <= 2 * need and (best is None or len(b) < len(self._bufs[best])) \
                    and _idle(b):
                best = i
        if best is not None:
            b = self._bufs[best]
            return b, _addr(b)
        b, addr = _new_buffer(need)
        self._bufs.append(b)
        while len(self._bufs) > self._keep:  # drop an idle one first, else the oldest
            idle = [i for i, x in enumerate(self._bufs[:-1]) if _idle(x)]
            del self._bufs[idle[0] if idle else 0]
        return b, addr

    def _copy_out(self, items, with_meta):
        """One copy of each (address, length, dtype, shape) into one buffer;
        read-only memoryview slices of it."""
        offs, total = [], 0
        for it in items:
            offs.append(total)
            total += (it[1] + _ALIGN - 1) // _ALIGN * _ALIGN
        buf, addr = self._buffer(total)
        whole = memoryview(buf)
        res = []
        for (p, ln, dt, sh), off in zip(items, offs):
            if ln:
                ctypes.memmove(addr + off, p, ln)  # releases the GIL
            data = whole[off:off + ln].toreadonly()
            res.append((data, dt, sh) if with_meta else data)
        whole.release()
        return res

    def retrieve(self, keys, with_meta=False):
        """The longest available prefix of keys: a list (maybe shorter) of
        read-only memoryviews, one per object, with the bytes that were
        stored (bytes-like: ==, len, slicing, bytes(x), hashlib, numpy /
        torch frombuffer work; bytes(x) for a bytes object).

        Each object is copied once, from the pool (or the received frame)
        into a buffer the client owns. The client keeps up to keep_buffers
        such buffers and reuses one once every view of it is gone, so a
        loop that drops the last results pays no page faults; a view kept
        alive keeps its whole buffer (that call's results) alive.
        with_meta: (data, dtype, shape) tuples."""
        lib = _L()
        ck = _ckeys(keys)
        if self.shm_active:
            v = ctypes.POINTER(_CRView)()
            rc = lib.kvt_retrieve_begin(self._h, ctypes.byref(ck), ctypes.byref(v))
            if not (rc == E_UNSUPPORTED and not self.shm_active):  # else: a restarted server
                self._check(rc)                                    # that is not local: inline
                try:
                    r = v.contents
                    items = []
                    for i in range(r.n):
                        m = r.meta[i]
                        items.append((r.ptrs[i], r.lens[i], m.dtype.decode(), tuple(m.shape[: m.ndim])))
                    res = self._copy_out(items, with_meta)
                except BaseException:
                    lib.kvt_retrieve_end(self._h, v)
                    raise
                # E_EXPIRED: the read lease ran out while copying: the bytes may
                # have changed, so nothing is returned
                self._check(lib.kvt_retrieve_end(self._h, v))
                return res
        out = ctypes.POINTER(_CBlob)()
        n = ctypes.c_size_t()
        self._check(lib.kvt_retrieve(self._h, ctypes.byref(ck), ctypes.byref(out), ctypes.byref(n)))
        try:
            items = []
            for i in range(n.value):
                b = out[i]
                items.append((b.data, b.len, b.dtype.decode(), tuple(b.shape[: b.ndim])))
            return self._copy_out(items, with_meta)
        finally:
            lib.kvt_blobs_free(out, n.value)

    def store_view(self, keys, sizes, dtype=None, shape=None, blocks=None):
        """Context manager: writable memoryviews into the pool, committed on exit.

        with c.store_view(keys, [nbytes] * len(keys)) as views:
            for v, t in zip(views, tensors):
                if v is not None:          # None: the server already has this key
                    v[:] = memoryview(t).cast("B")
        """
        sizes = [int(s) for s in sizes]
        if len(sizes) != len(keys):
            raise ValueError("one size per key")
        csz = (ctypes.c_size_t * max(len(sizes), 1))(*sizes)
        ck = _ckeys(keys)
        meta = _cmeta(dtype, shape)
        keep = []
        cb = _cblocks(blocks, len(keys), keep)  # blocks: as store's
        v = ctypes.POINTER(_CWView)()
        self._check(_L().kvt_store_begin_ex(self._h, ctypes.byref(ck), csz,
                                            ctypes.byref(meta) if meta else None,
                                            ctypes.byref(cb) if cb else None, ctypes.byref(v)))
        return _StoreView(self, v)

    def retrieve_view(self, keys):
        """Context manager: read-only memoryviews of the available prefix in the pool.

        Raises KvtierError(E_EXPIRED) on exit if the read lease expired while
        reading: then the bytes may have changed and must be discarded.
        """
        ck = _ckeys(keys)
        v = ctypes.POINTER(_CRView)()
        self._check(_L().kvt_retrieve_begin(self._h, ctypes.byref(ck), ctypes.byref(v)))
        return _RetrieveView(self, v)

    def status(self):
        """Server status as a dict (L1, per-adapter usage, counters, health)."""
        # the string is malloc'd by the library: read it, then free it
        p = ctypes.c_void_p()
        self._check(_L().kvt_status_json(
            self._h, ctypes.cast(ctypes.byref(p), ctypes.POINTER(ctypes.c_char_p))))
        try:
            return json.loads(ctypes.string_at(p.value).decode())
        finally:
            _libc.free(p.value)

    def delete(self, keys):
        """Delete keys from every tier; returns the objects removed from L2."""
        n = ctypes.c_size_t()
        ck = _ckeys(keys)
        self._check(_L().kvt_delete(self._h, ctypes.byref(ck), ctypes.byref(n)))
        return n.value
