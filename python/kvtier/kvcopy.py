"""Gather and scatter of paged KV-cache blocks to and from kvtier objects.

An inference engine keeps its attention KV cache in pages ("blocks") of
`block_size` tokens: per layer one tensor with a block dimension (vLLM:
`[2, num_blocks, ...]` for K and V, or `[num_blocks, ...]` for MLA or the CPU
backend). A kvtier object holds one chunk of `chunk_size` tokens of every
layer: for each layer, in the engine's layer order, the chunk's blocks of that
layer's tensor, as `tensor.index_select(block_dim, chunk_blocks)` would lay
them out (contiguous).

`gather` copies the blocks of a chunk straight into a writable buffer (a view
of kvtier's shared-memory pool) and `scatter` copies them back from a buffer
into the blocks of another request: one copy each way, no staging buffer on
the CPU. On CUDA the pool is registered as pinned host memory
(`cudaHostRegister`) so the copies are DMA: the blocks are gathered on the
device into one contiguous staging tensor and moved with a single
device-to-host copy (and the reverse on load).

On the CPU, when every block of a layer is one contiguous piece per leading
slice (vLLM's layouts are), the copies are plain memcpys in kvtier's C
library (`kvt_copy_chunks`, called through ctypes, which releases the GIL
for the call; a batch is one call, its threads in C): a tensor indexing
kernel moved these bytes at a third of memcpy's speed. Other layouts, and a missing C library, take the torch path.

Only torch (and kvtier's own C library, when present) is needed: nothing
here imports vLLM, so the copy routines can be exercised (and benchmarked)
with a plain paged tensor and random block tables.
"""

import ctypes
import math
import os
import warnings

import torch

__all__ = ["PagedLayout", "LayoutError", "DTYPE_NAMES"]

# kvtier object dtypes (docs/protocol.md, `store`) for the KV cache dtypes we carry.
DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


class LayoutError(ValueError):
    """The KV cache cannot be carried in kvtier chunks (clear message for the operator)."""


class _CCopyLayer(ctypes.Structure):
    """include/kvtier/client.h: kvt_copy_layer."""
    _fields_ = [("base", ctypes.c_uint64), ("obj_off", ctypes.c_uint64),
                ("seg_bytes", ctypes.c_uint64), ("block_stride", ctypes.c_uint64),
                ("lead_stride", ctypes.c_uint64), ("num_blocks", ctypes.c_uint64),
                ("lead", ctypes.c_uint32)]


def _c_copy():
    """kvt_copy_chunks from kvtier's C library (a batch of chunks in one call,
    its threads in C), or None without it."""
    try:
        from kvtier import _L
        fn = _L().kvt_copy_chunks
    except (ImportError, OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_bool, ctypes.POINTER(_CCopyLayer), ctypes.c_uint32,
                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                   ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32, ctypes.c_uint32,
                   ctypes.c_uint32]
    fn.restype = ctypes.c_int
    return fn


def _memcpy_layer(t, bdim, off):
    """The kvt_copy_layer of a CPU tensor whose blocks are contiguous pieces
    (per leading slice), or None when they are not (the torch path copies it)."""
    if t.device.type != "cpu":
        return None
    shape, stride, elem = list(t.shape), list(t.stride()), t.element_size()
    want = 1
    for d in range(len(shape) - 1, bdim, -1):  # the block's own dims: contiguous
        if shape[d] != 1 and stride[d] != want:
            return None
        want *= shape[d]
    for d in range(bdim - 1):  # the leading dims collapse into one
        if shape[d] != 1 and stride[d] != stride[d + 1] * shape[d + 1]:
            return None
    lead = math.prod(shape[:bdim])
    return _CCopyLayer(base=t.data_ptr(), obj_off=off, seg_bytes=want * elem,
                       block_stride=stride[bdim] * elem,
                       lead_stride=(stride[bdim - 1] * elem) if bdim else 0,
                       num_blocks=shape[bdim], lead=lead)


class _Layer:
    __slots__ = ("name", "tensor", "bdim", "block_bytes", "off")

    def __init__(self, name, tensor, bdim, block_bytes, off):
        self.name = name
        self.tensor = tensor
        self.bdim = bdim
        self.block_bytes = block_bytes
        self.off = off


def _block_dim(name, t, num_blocks):
    dims = [d for d, n in enumerate(t.shape) if n == num_blocks]
    if not dims:
        raise LayoutError("layer %s: no dimension of size num_blocks=%d in KV tensor of shape %s"
                          % (name, num_blocks, tuple(t.shape)))
    if len(dims) == 1:
        return dims[0]
    # [2, num_blocks, ...] (K and V) puts blocks second; otherwise blocks lead.
    return 1 if t.shape[0] == 2 and 1 in dims else dims[0]


class PagedLayout:
    """The chunk <-> paged-block mapping of one engine worker's KV caches.

    kv_caches: {layer_name: tensor} in the engine's layer order (vLLM's
    register_kv_caches); num_blocks and block_size of the paged cache;
    chunk_size: tokens per kvtier object (a multiple of block_size);
    copy_threads: how many threads `gather_many` / `scatter_many` copy with on
    the memcpy path (default: the CPUs this process may use, at most 4).
    """

    def __init__(self, kv_caches, num_blocks, block_size, chunk_size, copy_threads=None):
        if block_size <= 0 or chunk_size <= 0 or chunk_size % block_size:
            raise LayoutError(
                "kvtier's chunk size (%d tokens) must be a multiple of vLLM's block size (%d): "
                "start kvtier with --chunk-size N*%d or vLLM with --block-size dividing %d"
                % (chunk_size, block_size, block_size, chunk_size))
        if not kv_caches:
            raise LayoutError("no KV cache tensors to carry")
        self.block_size = block_size
        self.chunk_size = chunk_size
        self.blocks_per_chunk = chunk_size // block_size
        self.layers = []
        seen = {}
        dtype = None
        device = None
        off = 0
        for name, t in kv_caches.items():
            if isinstance(t, (list, tuple)):
                raise LayoutError("layer %s: a list of KV tensors per layer is not supported" % name)
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            if key in seen:  # layers sharing one KV cache (cross-layer sharing): carried once
                continue
            seen[key] = name
            if dtype is None:
                dtype, device = t.dtype, t.device
            if t.dtype != dtype or t.device != device:
                raise LayoutError("layer %s: KV dtype/device %s/%s differs from %s/%s"
                                  % (name, t.dtype, t.device, dtype, device))
            if t.dtype not in DTYPE_NAMES:
                raise LayoutError("layer %s: KV cache dtype %s is not supported "
                                  "(float32, float16, bfloat16)" % (name, t.dtype))
            bdim = _block_dim(name, t, num_blocks)
            block_bytes = t.numel() // t.shape[bdim] * t.element_size()
            self.layers.append(_Layer(name, t, bdim, block_bytes, off))
            off += block_bytes * self.blocks_per_chunk
        self.dtype = dtype
        self.device = device
        self.dtype_name = DTYPE_NAMES[dtype]
        self.chunk_bytes = off
        self.elem = torch.tensor([], dtype=dtype).element_size()
        # stored with every object and checked on load: an object written
        # with another block size, layer count or layout is never scattered
        self.shape = [len(self.layers), self.blocks_per_chunk, block_size,
                      self.layers[0].block_bytes]
        self._staging = None
        # the memcpy path: every layer's blocks contiguous, the C library there
        self._ccopy = None
        if device.type == "cpu":
            cl = [_memcpy_layer(L.tensor, L.bdim, L.off) for L in self.layers]
            fn = _c_copy() if all(c is not None for c in cl) else None
            if fn is not None:
                self._ccopy = (fn, (_CCopyLayer * len(cl))(*cl), len(cl))
        if copy_threads is None:
            copy_threads = min(4, len(os.sched_getaffinity(0)))
        self.copy_threads = max(1, int(copy_threads))

    def copy_path(self):
        """How chunks are copied, for the log: "memcpy, N threads" or "torch"."""
        if self._ccopy is not None:
            return "memcpy per block, %d thread(s)" % self.copy_threads
        return "torch indexing on %s" % self.device.type

    # ------------------------------------------------------------ helpers

    def _out(self, buf, layer, nblocks):
        """A tensor over `buf` shaped like `layer` with `nblocks` blocks."""
        shape = list(layer.tensor.shape)
        shape[layer.bdim] = nblocks
        return buf.view(self.dtype).view(shape)

    def _as_u8(self, mv):
        if isinstance(mv, torch.Tensor):
            return mv
        with warnings.catch_warnings():
            # a retrieve view is read-only; scatter only reads it
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            return torch.frombuffer(mv, dtype=torch.uint8)

    def matches(self, dtype_name, shape):
        return dtype_name == self.dtype_name and list(shape) == self.shape

    # --------------------------------------------------------------- copies

    def gather(self, block_ids, dst):
        """Copy the chunk made of `block_ids` (blocks_per_chunk of them) into `dst`
        (a writable buffer of chunk_bytes, e.g. a pool memoryview)."""
        if len(block_ids) != self.blocks_per_chunk:
            raise ValueError("a chunk is %d blocks, got %d" % (self.blocks_per_chunk, len(block_ids)))
        u8 = self._as_u8(dst)
        if u8.numel() != self.chunk_bytes:
            raise ValueError("buffer of %d bytes for a chunk of %d" % (u8.numel(), self.chunk_bytes))
        n = self.blocks_per_chunk
        if self._memcpy_ok(u8):
            self._memcpy(True, [u8], [block_ids])
            return
        if self.device.type == "cpu":
            idx = torch.tensor(block_ids, dtype=torch.long)
            for L in self.layers:
                out = self._out(u8[L.off:L.off + L.block_bytes * n], L, n)
                torch.index_select(L.tensor, L.bdim, idx, out=out)
            return
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        stage = self._staging_for(self.chunk_bytes)
        for L in self.layers:
            out = self._out(stage[L.off:L.off + L.block_bytes * n], L, n)
            torch.index_select(L.tensor, L.bdim, idx, out=out)
        u8.copy_(stage[:self.chunk_bytes], non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()

    def scatter(self, src, block_ids):
        """Copy a chunk from `src` (chunk_bytes) into `block_ids`; an id < 0 skips
        that block (the engine already holds it)."""
        if len(block_ids) != self.blocks_per_chunk:
            raise ValueError("a chunk is %d blocks, got %d" % (self.blocks_per_chunk, len(block_ids)))
        u8 = self._as_u8(src)
        if u8.numel() != self.chunk_bytes:
            raise ValueError("object of %d bytes for a chunk of %d" % (u8.numel(), self.chunk_bytes))
        if self._memcpy_ok(u8):
            self._memcpy(False, [u8], [block_ids])
            return
        n = self.blocks_per_chunk
        keep = [i for i, b in enumerate(block_ids) if b >= 0]
        if not keep:
            return
        dev = self.device
        if dev.type != "cpu":
            stage = self._staging_for(self.chunk_bytes)
            stage[:self.chunk_bytes].copy_(u8, non_blocking=True)
            u8 = stage
        dst_idx = torch.tensor([block_ids[i] for i in keep], dtype=torch.long, device=dev)
        sel = None if len(keep) == n else torch.tensor(keep, dtype=torch.long, device=dev)
        for L in self.layers:
            part = self._out(u8[L.off:L.off + L.block_bytes * n], L, n)
            if sel is not None:
                part = part.index_select(L.bdim, sel)
            L.tensor.index_copy_(L.bdim, dst_idx, part)
        if dev.type != "cpu":
            torch.cuda.current_stream(dev).synchronize()

    def gather_many(self, pairs):
        """gather(block_ids, dst) for each (block_ids, dst) of a batch."""
        pairs = list(pairs)
        if not self._batch(True, [(d, ids) for ids, d in pairs]):
            for ids, d in pairs:
                self.gather(ids, d)

    def scatter_many(self, pairs):
        """scatter(src, block_ids) for each (src, block_ids) of a batch."""
        pairs = list(pairs)
        if not self._batch(False, pairs):
            for src, ids in pairs:
                self.scatter(src, ids)

    def _batch(self, to_object, pairs):
        """The whole batch on the memcpy path in one kvt_copy_chunks call
        (split over copy_threads threads in C, the GIL released once, every
        chunk checked before any is copied): True when done, False when a
        buffer needs the per-chunk torch path."""
        if self._ccopy is None:
            return False
        n = self.blocks_per_chunk
        bufs, ids = [], []
        for obj, block_ids in pairs:
            if len(block_ids) != n:
                raise ValueError("a chunk is %d blocks, got %d" % (n, len(block_ids)))
            u8 = self._as_u8(obj)
            if u8.numel() != self.chunk_bytes:
                raise ValueError("buffer of %d bytes for a chunk of %d"
                                 % (u8.numel(), self.chunk_bytes))
            if not self._memcpy_ok(u8):
                return False
            bufs.append(u8)
            ids.append(block_ids)
        if bufs:
            self._memcpy(to_object, bufs, ids)
        return True

    def _memcpy_ok(self, u8):
        return (self._ccopy is not None and u8.dtype == torch.uint8 and u8.is_contiguous()
                and u8.device.type == "cpu")

    def _memcpy(self, to_object, bufs, id_lists):
        """kvt_copy_chunks over chunks bufs[i] (uint8 tensors, alive until it
        returns) with blocks id_lists[i]."""
        fn, layers, nl = self._ccopy
        ptrs = (ctypes.c_void_p * len(bufs))(*[b.data_ptr() for b in bufs])
        flat = [b for ids in id_lists for b in ids]
        arr = (ctypes.c_int64 * len(flat))(*flat)
        rc = fn(to_object, layers, nl, ptrs, self.chunk_bytes, arr, self.blocks_per_chunk,
                len(bufs), self.copy_threads)
        if rc:
            raise ValueError("kvt_copy_chunks refused the copy (%d): block ids out of range "
                             "for %d blocks" % (rc, self.layers[0].tensor.shape[
                                 self.layers[0].bdim]))

    def _staging_for(self, nbytes):
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._staging


def register_pinned(address, size):
    """Register a host range (the mapped kvtier pool: `Client.pool`) with CUDA
    as pinned memory, so device copies to and from pool slots are DMA.
    Returns a callable that unregisters it, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    rt = torch.cuda.cudart()
    rc = rt.cudaHostRegister(address, size, 0)
    if int(getattr(rc, "value", rc)) != 0:
        raise RuntimeError("cudaHostRegister of the kvtier pool (%d bytes) failed: %s" % (size, rc))

    def unregister():
        rt.cudaHostUnregister(address)

    return unregister
