"""kvtier.kvcopy without vLLM: paged KV tensors of the layouts vLLM uses,
random block tables, gathered into a real kvtier server's shared-memory pool
and scattered back into other blocks; every byte checked."""

import random

import pytest
import torch

import kvtier
from support.server import Server
from kvtier.kvcopy import LayoutError, PagedLayout

NB, BS = 64, 16

LAYOUTS = {
    # vLLM's FlashAttention-style [2, num_blocks, block_size, heads, head_dim]
    "kv_first": lambda dt: [torch.randn(2, NB, BS, 4, 8).to(dt) for _ in range(3)],
    # vLLM's CPU backend [num_blocks, heads, block_size, 2 * head_dim]
    "cpu_attn": lambda dt: [torch.randn(NB, 4, BS, 16).to(dt) for _ in range(3)],
    # MLA: one latent tensor per layer [num_blocks, block_size, dim]
    "mla": lambda dt: [torch.randn(NB, BS, 24).to(dt) for _ in range(3)],
    # a permuted (non-contiguous) view, as a stride order gives
    "strided": lambda dt: [torch.randn(NB, BS, 2, 4, 8).to(dt).permute(2, 0, 3, 1, 4)
                           for _ in range(3)],
}


@pytest.fixture(scope="module")
def kvt(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvcopy")
    s = Server(["--chunk-size", str(BS * 4), "--no-l2"], d)
    s.start()
    yield s
    s.kill()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gather_scatter_round_trip_through_the_pool(kvt, layout, dtype):
    layers = LAYOUTS[layout](dtype)
    caches = {"model.layers.%d.attn" % i: t for i, t in enumerate(layers)}
    L = PagedLayout(caches, NB, BS, BS * 4)
    assert L.blocks_per_chunk == 4 and L.dtype_name == str(dtype).split(".")[1]
    r = random.Random(hash((layout, str(dtype))) & 0xFFFF)
    blocks = r.sample(range(NB), 32)
    src_chunks = [blocks[i:i + 4] for i in range(0, 16, 4)]
    dst_chunks = [blocks[i:i + 4] for i in range(16, 32, 4)]
    dst_chunks[1][0] = -1                      # the engine already holds that block
    keys = kvtier.chunk_keys("kvcopy-%s-%s" % (layout, dtype), list(range(BS * 4 * 4)),
                             chunk_size=BS * 4)
    with kvt.client() as c:
        assert c.shm_active
        with c.store_view(keys, [L.chunk_bytes] * 4, dtype=L.dtype_name, shape=L.shape) as views:
            for v, ch in zip(views, src_chunks):
                L.gather(ch, v)
        before = [t.clone() for t in layers]
        rv = c.retrieve_view(keys)
        with rv as views:
            assert len(views) == 4
            for (dt, shape), v, ch in zip(rv.metas, views, dst_chunks):
                assert L.matches(dt, shape)
                L.scatter(v, ch)
    for t, old in zip(layers, before):
        bdim = [d for d, n in enumerate(t.shape) if n == NB][0]
        for s_ch, d_ch in zip(src_chunks, dst_chunks):
            for sb, db in zip(s_ch, d_ch):
                if db < 0:
                    assert torch.equal(t.select(bdim, sb), old.select(bdim, sb))
                    continue
                assert torch.equal(t.select(bdim, db), old.select(bdim, sb))
        untouched = set(range(NB)) - {b for ch in dst_chunks for b in ch}
        for b in untouched:
            assert torch.equal(t.select(bdim, b), old.select(bdim, b))


def test_layouts_that_cannot_be_carried_are_refused():
    t = torch.zeros(2, NB, BS, 4, 8)
    with pytest.raises(LayoutError, match="multiple of vLLM's block size"):
        PagedLayout({"a": t}, NB, BS, BS * 4 + 1)
    with pytest.raises(LayoutError, match="dtype"):
        PagedLayout({"a": t.to(torch.int8)}, NB, BS, BS * 4)
    with pytest.raises(LayoutError, match="no dimension of size num_blocks"):
        PagedLayout({"a": t}, NB + 1, BS, BS * 4)
    with pytest.raises(LayoutError, match="differs"):
        PagedLayout({"a": t, "b": t.to(torch.float16)}, NB, BS, BS * 4)


def test_an_object_of_another_layout_is_not_scattered():
    t = torch.zeros(2, NB, BS, 4, 8)
    a = PagedLayout({"a": t}, NB, BS, BS * 4)
    b = PagedLayout({"a": torch.zeros(2, NB, BS // 2, 4, 8)}, NB, BS // 2, BS * 4)
    assert not a.matches(b.dtype_name, b.shape)
    with pytest.raises(ValueError):
        a.scatter(bytearray(a.chunk_bytes - 1), [0, 1, 2, 3])


def copy_like_torch(layers, nb, bs, chunk, dst):
    """Gather chunk and scatter it into dst (-1: skipped) through the C
    path and through torch's: the same object bytes and the same caches.
    Returns whether the C path was taken."""
    caches = {"l%d" % i: t for i, t in enumerate(layers)}
    fast = PagedLayout(caches, nb, bs, bs * len(chunk))
    slow = PagedLayout(caches, nb, bs, bs * len(chunk))
    slow._ccopy = None
    a, b = bytearray(fast.chunk_bytes), bytearray(fast.chunk_bytes)
    fast.gather(chunk, memoryview(a))
    slow.gather(chunk, memoryview(b))
    assert a == b
    before = [t.clone() for t in layers]
    fast.scatter(memoryview(a), dst)
    after_fast = [t.clone() for t in layers]
    for t, old in zip(layers, before):
        t.copy_(old)
    slow.scatter(memoryview(b), dst)
    for t, f in zip(layers, after_fast):
        assert torch.equal(t, f)
    for t, old in zip(layers, before):
        assert not torch.equal(t, old)
    return fast._ccopy is not None


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_memcpy_path_writes_the_layout_the_torch_path_does(layout):
    """kvt_copy_blocks (the CPU memcpy path) and torch's index_select /
    index_copy_ give the same object bytes and the same cache contents, so
    objects written by either (or by the CUDA path) load through the other."""
    # scatter one chunk's bytes into other blocks (one skipped) both ways;
    # every contiguous layout takes the memcpy path; the permuted view cannot
    c = copy_like_torch(LAYOUTS[layout](torch.float16), NB, BS, [5, 17, 2, 40], [9, -1, 33, 63])
    assert c == (layout != "strided")


def test_large_unaligned_blocks_copy_like_torch():
    """Blocks of 16 KiB and more are copied with non-temporal stores
    (kvcopy.c): a block of 15 tokens x 33 heads x 127 dims in bf16 is
    125,730 bytes, so its copies start on every alignment and end with a
    tail shorter than a store; both directions must match torch's path."""
    nb, bs = 8, 15
    layers = [torch.randn(2, nb, bs, 33, 127).to(torch.bfloat16) for _ in range(2)]
    assert copy_like_torch(layers, nb, bs, [6, 1, 3], [0, 7, 4])
    for t in layers:
        for sb, db in zip([6, 1, 3], [0, 7, 4]):
            assert torch.equal(t[:, db], t[:, sb])


def test_memcpy_path_refuses_block_ids_out_of_range():
    t = torch.randn(2, NB, BS, 4, 8)
    L = PagedLayout({"a": t}, NB, BS, BS * 4)
    assert L._ccopy is not None
    before = t.clone()
    buf = bytearray(L.chunk_bytes)
    buf[:] = b"\x01" * len(buf)
    with pytest.raises(ValueError, match="out of range"):
        L.scatter(memoryview(buf), [0, 1, 2, NB])
    assert torch.equal(t, before)  # checked first: nothing copied
    with pytest.raises(ValueError, match="out of range"):
        L.gather([NB + 5, 0, 1, 2], memoryview(buf))


def test_batches_copy_on_several_threads_like_one():
    """gather_many / scatter_many copy a batch in one kvt_copy_chunks call
    split over copy_threads threads in C: the same bytes as one chunk at a
    time, and a bad block id in any chunk copies nothing of the batch."""
    layers = LAYOUTS["kv_first"](torch.float32)
    caches = {"l%d" % i: t for i, t in enumerate(layers)}
    par = PagedLayout(caches, NB, BS, BS * 4, copy_threads=3)
    assert par._ccopy is not None
    chunks = [[4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3] for i in range(7)]
    a = [bytearray(par.chunk_bytes) for _ in chunks]
    b = [bytearray(par.chunk_bytes) for _ in chunks]
    par.gather_many((ch, memoryview(x)) for ch, x in zip(chunks, a))
    for ch, x in zip(chunks, b):  # one chunk a call, for comparison
        par.gather(ch, memoryview(x))
    assert a == b and len(set(map(bytes, a))) == len(chunks)
    dst = [[NB - 1 - j for j in ch] for ch in chunks]
    par.scatter_many((memoryview(x), d) for x, d in zip(a, dst))
    for t in layers:
        for ch, d in zip(chunks, dst):
            for sb, db in zip(ch, d):
                assert torch.equal(t[:, db], t[:, sb]) or sb == db
    bad = list(zip(map(memoryview, a), dst))
    bad[3] = (bad[3][0], [0, 1, 2, NB])
    for t in layers:  # make the scatter visible if it happened
        t.add_(1)
    before = [t.clone() for t in layers]
    with pytest.raises(ValueError, match="out of range"):
        par.scatter_many(bad)
    assert all(torch.equal(t, b) for t, b in zip(layers, before))  # checked first


def test_transfer_thread_cpus():
    """The worker's transfer thread leaves the model runner's core: by
    default for CPU KV caches the CPUs vLLM sets aside for KV transfer (one
    per NUMA node, online ones only), none for other devices (GPU copies are
    DMA), what copy_cpus names, or nothing for "inherit"; a bad copy_cpus is
    refused at start naming the key."""
    import os
    import types
    from kvtier.vllm import _Config, _transfer_cpus

    cpu = {"l0": torch.zeros(4, 4)}
    online = set(range(os.cpu_count()))
    auto = _transfer_cpus(None, cpu)
    if os.path.isdir("/sys/devices/system/node/node0"):
        from vllm.platforms import current_platform
        groups = current_platform.discover_numa_topology()
        # every core of vLLM's topology (out of the model runner's one-core
        # binding), not only the last of each node (docs/vllm.md: measured)
        assert auto == {c for g in groups for c in g} & online, (auto, groups)
    assert _transfer_cpus("inherit", cpu) is None
    assert _transfer_cpus([0], cpu) == {0}
    meta = {"l0": torch.zeros(4, 4, device="meta")}
    assert _transfer_cpus(None, meta) is None

    def cfg(extra):
        kv = types.SimpleNamespace(get_from_extra_config=lambda k, d: extra.get(k, d))
        return types.SimpleNamespace(
            kv_transfer_config=kv,
            model_config=types.SimpleNamespace(served_model_name="m", model="m"),
            cache_config=types.SimpleNamespace(block_size=16))

    assert _Config(cfg({"copy_cpus": [0, 1]}), 0, 1).copy_cpus == [0, 1]
    assert _Config(cfg({"copy_cpus": "inherit"}), 0, 1).copy_cpus == "inherit"
    for bad in ([], "all", [-1], [True], 3, ["0"]):
        with pytest.raises(ValueError, match="copy_cpus"):
            _Config(cfg({"copy_cpus": bad}), 0, 1)


def _connector_cfg(extra):
    """The vllm_config parts the connector's _Config reads."""
    import types
    kv = types.SimpleNamespace(get_from_extra_config=lambda k, d: extra.get(k, d))
    return types.SimpleNamespace(
        kv_transfer_config=kv,
        model_config=types.SimpleNamespace(served_model_name="chunk-change", model="chunk-change"),
        cache_config=types.SimpleNamespace(block_size=BS))


def test_worker_stops_when_the_server_returns_with_another_chunk_size(tmp_path):
    """kvtier restarted with another --chunk-size under a running engine: the
    worker notices on its own connection, stores nothing more and turns its
    loads into load errors (vLLM recomputes), as docs/vllm.md says."""
    import types
    from kvtier.vllm import LoadJob, StoreJob, _Config, _Worker

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    s1 = Server(["--chunk-size", str(BS * 4), "--no-l2"], tmp_path / "a")
    s1.start()
    cfg = _Config(_connector_cfg({"url": s1.url, "copy_cpus": "inherit", "retry_s": 0}), 0, 1)
    layers = [torch.randn(NB, 4, BS, 16) for _ in range(2)]
    w = _Worker(cfg)
    w.register_kv_caches({"l%d" % i: t for i, t in enumerate(layers)}, NB)
    s2 = None
    try:
        bpc = cfg.blocks_per_chunk
        hashes = kvtier.chunk_hashes(list(range(cfg.chunk_size)), cfg.chunk_size)
        w.save(types.SimpleNamespace(stores=[StoreJob("s0", "", hashes, [list(range(bpc))])]))
        w.drain()
        assert w.stats["store_chunks"] == 1 and not cfg.disabled
        s1.kill()
        s2 = Server(["--chunk-size", str(BS * 8), "--no-l2"], tmp_path / "b")
        s2.port, s2.url = s1.port, s1.url
        s2.start()
        for i in range(1, 4):   # a failed request, a reconnect, then the check
            w.save(types.SimpleNamespace(stores=[StoreJob("s%d" % i, "", hashes,
                                                          [list(range(bpc))])]))
            w.drain()
        assert cfg.disabled, w.stats
        stored = w.stats.get("store_chunks", 0)
        w.save(types.SimpleNamespace(stores=[StoreJob("s9", "", hashes, [list(range(bpc))])]))
        w.drain()
        assert w.stats.get("store_chunks", 0) == stored      # no store once disabled
        dst = list(range(bpc, 2 * bpc))
        w.start_load(types.SimpleNamespace(loads=[LoadJob("r", "", hashes, [dst])]))
        w.drain()
        assert w.take_load_errors() == set(dst)
    finally:
        w.shutdown()
        if s2 is not None:
            s2.kill()
