"""kvtier.sglang.KvtierStorage with SGLang's own classes (build/sglang-venv,
`make test-sglang`): SGLang's host KV pools built on the CPU (pin_memory
off, tiny sizes; the device buffers they mirror are CPU tensors too), its
storage backend factory loading kvtier's class by module path as
`--hicache-storage-backend dynamic` does, and the calls SGLang's cache
controller makes with `interface_v1` (batch_exists, batch_set_v1,
batch_get_v1) and without it (set/get/exists on flat data pages)."""

import json
import signal

import pytest
import torch

from sglang.srt.mem_cache.device_pool_info import (
    KVBufferLayout,
    KVBuffers,
    MHABufferInfo,
    MLABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from support.data import adapter_json
from support.server import SANITIZER_MARKERS, Server

import kvtier.sglang as ks

LAYERS, HEADS, DIM, PAGE, HOST_TOKENS = 3, 2, 16, 4, 128
MODEL = "test/tiny-sglang"


def host_pool(layout, dtype=torch.bfloat16):
    """SGLang's MHA host pool on the CPU, as its controller builds it from
    the device pool's buffer description (here CPU tensors)."""
    dev_tokens = 64
    k = tuple(torch.zeros(dev_tokens, HEADS, DIM, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(dev_tokens, HEADS, DIM, dtype=dtype) for _ in range(LAYERS))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM, dtype=dtype,
        device=torch.device("cpu"))
    # SGLang keeps 10 GB of host RAM free when it sizes a pool; these are
    # a few KB, booked against a budget of their own (SGLang's scope for that)
    with host_memory_budget_scope(1 << 30):
        return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                    device_capacity_tokens=dev_tokens, start_layer=0,
                                    end_layer=LAYERS, host_token_capacity=HOST_TOKENS)


def mla_host_pool(layout, lora=32, rope=16):
    """SGLang's MLA host pool on the CPU (one latent row per token and layer)."""
    bufs = tuple(torch.zeros(64, 1, lora + rope, dtype=torch.bfloat16) for _ in range(LAYERS))
    info = MLABufferInfo(
        buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)), device_layer_num=LAYERS, page_size=PAGE,
        kv_lora_rank=lora, qk_rope_head_dim=rope, kv_cache_dim=lora + rope,
        dtype=torch.bfloat16, device=torch.device("cpu"))
    with host_memory_budget_scope(1 << 30):
        return MLATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                    device_capacity_tokens=64, start_layer=0, end_layer=LAYERS,
                                    target_layer_num=LAYERS, host_token_capacity=HOST_TOKENS)


def storage_config(url, tp_rank=0, tp_size=1, mla=False, **extra):
    cfg = {"backend_name": "kvtier", "module_path": "kvtier.sglang",
           "class_name": "KvtierStorage", "interface_v1": 1, "url": url,
           "timeout_ms": 2000, "retry_s": 0.2}
    cfg.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=MODEL, extra_config=cfg)


def backend(url, pool, **extra):
    """What SGLang's controller does in attach_storage_backend."""
    b = StorageBackendFactory.create_backend("dynamic", storage_config(url, **extra), pool)
    b.register_mem_pool_host(pool)
    return b


def page_keys(n, tag="a"):
    import hashlib
    prev = b""
    out = []
    for i in range(n):
        prev = hashlib.sha256(prev + ("%s-%d" % (tag, i)).encode()).digest()
        out.append(prev.hex())
    return out


def fill(pool, n_pages, seed):
    """Random bytes in the first n_pages pages of the pool; their indices."""
    g = torch.Generator().manual_seed(seed)
    idx = pool.alloc(n_pages * PAGE)
    assert idx is not None
    for p in range(n_pages):
        page = pool.get_data_page(int(idx[p * PAGE]), flat=False)
        page.copy_(torch.randn(page.shape, generator=g).to(page.dtype))
    return idx


def pages(pool, idx):
    return [pool.get_data_page(int(idx[p * PAGE]), flat=True).clone()
            for p in range(len(idx) // PAGE)]


def zero(pool, idx):
    for p in range(len(idx) // PAGE):
        pool.get_data_page(int(idx[p * PAGE]), flat=False).zero_()


def same_bytes(a, b):
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b)) \
        and len(a) == len(b)


@pytest.fixture
def server(tmp_path):
    s = Server(["--l2-prefetch-policy", "retain", "--l2-adapter",
                adapter_json(type="fs", base_path=str(tmp_path / "fs"))],
               tmp_path, data_dir=str(tmp_path / "data"))
    s.start()
    yield s
    s.kill()
    log = s.read_log()
    for m in SANITIZER_MARKERS:
        assert m not in log, log


def wait_l2(server, n):
    from support.server import l2_status, wait_for
    wait_for(lambda: l2_status(server)["objects"] >= n, what="%d objects in L2" % n)


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct", "page_head"])
def test_set_zero_get_identical(server, layout):
    pool = host_pool(layout)
    b = backend(server.url, pool)
    assert isinstance(b, ks.KvtierStorage)  # the factory loaded it by module path
    assert layout in b.model and "bfloat16" in b.model
    n = 6
    idx = fill(pool, n, seed=1)
    want = pages(pool, idx)
    keys = page_keys(n)
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, idx) == [True] * n
    assert b.batch_exists(keys) == n
    # each object holds the page in the order of SGLang's flat data page
    assert same_bytes(b.batch_get(keys), want)
    # same host: the pages went through kvtier's shared-memory pool (one copy)
    assert b._conn().client.shm_active
    # the leading run only, as SGLang's hit query expects
    assert b.batch_exists(keys[:2] + page_keys(1, "missing") + keys[3:]) == 2
    zero(pool, idx)
    assert not same_bytes(pages(pool, idx), want)
    assert b.batch_get_v1(keys, idx, HiCacheStorageExtraInfo(prefix_keys=[])) == [True] * n
    assert same_bytes(pages(pool, idx), want)
    # into other host slots than the ones stored from
    idx2 = pool.alloc(n * PAGE)
    assert b.batch_get_v1(keys, idx2) == [True] * n
    assert same_bytes(pages(pool, idx2), want)
    # a missing page in the middle: the leading run is loaded, the rest reported
    assert b.batch_get_v1(keys[:3] + page_keys(1, "missing") + keys[4:], idx2) == \
        [True] * 3 + [False] * 3
    assert b.stats.get("errors", 0) == 0
    b.close()
    # SGLang detaches the backend: later calls are misses, not a crash
    assert b.batch_exists(keys) == 0 and b.batch_get_v1(keys, idx) == [False] * n


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_mla_pages_shared_by_tp_ranks(server, layout):
    """MLA's latent KV is the same on every TP rank: rank 0 (SGLang's
    writer) stores, rank 1 of another engine loads; an MHA engine of the
    same model name never sees the pages."""
    p0, p1 = mla_host_pool(layout), mla_host_pool(layout)
    w = backend(server.url, p0, mla=True, tp_rank=0, tp_size=2)
    r = backend(server.url, p1, mla=True, tp_rank=1, tp_size=2)
    idx = fill(p0, 5, seed=8)
    want = pages(p0, idx)
    keys = page_keys(5, "mla-" + layout)
    assert w.batch_set_v1(keys, idx) == [True] * 5
    idx1 = p1.alloc(5 * PAGE)
    assert r.batch_exists(keys) == 5
    assert same_bytes(r.batch_get(keys), want)  # flat data page order
    assert r.batch_get_v1(keys, idx1) == [True] * 5
    assert same_bytes(pages(p1, idx1), want)
    mha = backend(server.url, host_pool(layout))
    assert mha.batch_exists(keys) == 0
    for x in (w, r, mha):
        x.close()


def test_generic_path_matches_zero_copy(server):
    """Without interface_v1 SGLang calls set/get with flat data pages: the
    same objects as batch_set_v1 (and as SGLang's file backend writes)."""
    pool = host_pool("page_first")
    b = backend(server.url, pool)
    idx = fill(pool, 4, seed=2)
    want = pages(pool, idx)
    keys = page_keys(4, "generic")
    assert b.batch_set(keys[:2], [pool.get_data_page(int(idx[i * PAGE])) for i in range(2)])
    assert b.set(keys[2], pool.get_data_page(int(idx[2 * PAGE])))
    assert b.batch_set_v1(keys[3:], idx[3 * PAGE:]) == [True]
    assert b.exists(keys[3]) and b.batch_exists(keys) == 4
    zero(pool, idx)
    assert b.batch_get_v1(keys[:2], idx[:2 * PAGE]) == [True, True]
    got = b.batch_get(keys[2:], [pool.get_dummy_flat_data_page() for _ in range(2)])
    assert same_bytes(pages(pool, idx)[:2] + got, want)
    assert b.get(page_keys(1, "nope")[0], pool.get_dummy_flat_data_page()) is None
    assert not b.exists(page_keys(1, "nope")[0])
    b.close()


def test_restart_serves_from_l2(server):
    pool = host_pool("page_first_direct")
    b = backend(server.url, pool)
    n = 8
    idx = fill(pool, n, seed=3)
    want = pages(pool, idx)
    keys = page_keys(n, "restart")
    assert b.batch_set_v1(keys, idx) == [True] * n
    wait_l2(server, n)
    server.kill(signal.SIGKILL)
    server.start()
    server.wait_recovered()
    zero(pool, idx)
    # the first call after the restart may meet the dead connection: a miss,
    # then the backend reconnects by itself after retry_s
    from support.server import wait_for
    wait_for(lambda: b.batch_exists(keys) == n, timeout=60, what="hits after the restart")
    assert b.batch_get_v1(keys, idx) == [True] * n
    assert same_bytes(pages(pool, idx), want)
    with server.client() as c:
        assert c.status()["l2"][0]["counters"]["load_ok"] >= n  # they came from L2
    b.close()


def test_tenants_never_share(server):
    pool = host_pool("page_first")
    a = backend(server.url, pool, tenant="alice")
    bob = backend(server.url, pool, tenant="bob")
    none = backend(server.url, pool)
    idx = fill(pool, 3, seed=4)
    want = pages(pool, idx)
    keys = page_keys(3, "tenant")
    assert a.batch_set_v1(keys, idx) == [True] * 3
    assert a.batch_exists(keys) == 3
    assert bob.batch_exists(keys) == 0 and none.batch_exists(keys) == 0
    zero(pool, idx)
    assert bob.batch_get_v1(keys, idx) == [False] * 3
    assert none.batch_get(keys) == [None] * 3
    assert same_bytes(pages(pool, idx), [torch.zeros_like(w) for w in want])
    # the tenant of one call (extra_info) wins over the configured one
    carol = HiCacheStorageExtraInfo(extra_info={"tenant": "carol"})
    assert bob.batch_exists(keys, HiCacheStorageExtraInfo(extra_info={"tenant": "alice"})) == 3
    assert a.batch_exists(keys, carol) == 0
    assert a.batch_get_v1(keys, idx) == [True] * 3
    assert same_bytes(pages(pool, idx), want)
    # and other TP ranks (or sizes) never share with rank 0 of TP 1
    tp = backend(server.url, pool, tenant="alice", tp_rank=1, tp_size=2)
    assert tp.batch_exists(keys) == 0
    with pytest.raises(ValueError, match="tenant"):
        backend(server.url, pool, tenant="a/b")
    for x in (a, bob, none, tp):
        x.close()


def test_killed_server_means_misses(server):
    pool = host_pool("page_first")
    b = backend(server.url, pool)
    idx = fill(pool, 4, seed=5)
    want = pages(pool, idx)
    keys = page_keys(4, "killed")
    assert b.batch_set_v1(keys[:2], idx[:2 * PAGE]) == [True, True]
    server.kill(signal.SIGKILL)
    # every call of the controller: a miss or a failed write, never an exception
    for _ in range(2):
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, idx) == [False] * 4
        assert b.batch_set_v1(keys, idx) == [False] * 4
        assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None
        assert b.set(keys[0], pool.get_data_page(0)) is False
        assert b.exists(keys[0]) is False
    assert b.stats["errors"] >= 1
    assert same_bytes(pages(pool, idx), want)  # a failed get left the pool alone
    # back on the same port: it reconnects by itself
    server.start()
    from support.server import wait_for
    wait_for(lambda: b.batch_set_v1(keys, idx) == [True] * 4, what="stores after the restart")
    zero(pool, idx)
    assert b.batch_get_v1(keys, idx) == [True] * 4
    assert same_bytes(pages(pool, idx), want)
    b.close()


def test_no_server_at_start():
    """The engine starts while kvtier is not there: misses, no exception."""
    from support.ports import free_port
    pool = host_pool("page_first")
    b = backend("tcp://127.0.0.1:%d" % free_port(), pool)
    idx = fill(pool, 1, seed=6)
    assert b.batch_exists(page_keys(1)) == 0
    assert b.batch_set_v1(page_keys(1), idx) == [False]
    assert b.batch_get_v1(page_keys(1), idx) == [False]


def test_refuses_unsupported_layout(server):
    pool = host_pool("page_first")
    b = ks.KvtierStorage(storage_config(server.url), {})
    pool.layout = "page_unified"  # as SGLang's --hicache-mem-layout page_unified
    with pytest.raises(ValueError, match="layout 'page_unified'.*not supported"):
        b.register_mem_pool_host(pool)

    class Other:
        layout = "page_first"
    with pytest.raises(ValueError, match="host pool Other is not supported"):
        b.register_mem_pool_host(Other())


def test_factory_config_is_json_of_the_launch_flag(server):
    """The extra config arrives as SGLang parses
    --hicache-storage-backend-extra-config (a JSON object)."""
    flag = json.dumps({"backend_name": "kvtier", "module_path": "kvtier.sglang",
                       "class_name": "KvtierStorage", "interface_v1": 1, "url": server.url})
    cfg = storage_config(server.url)
    cfg.extra_config = json.loads(flag)
    pool = host_pool("layer_first")
    b = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    b.register_mem_pool_host(pool)
    idx = fill(pool, 2, seed=7)
    assert b.batch_set_v1(page_keys(2, "flag"), idx) == [True, True]
    assert b.batch_exists(page_keys(2, "flag")) == 2
    b.close()


def test_controller_threads_concurrently(server):
    """SGLang's backup, hit-query and prefetch-IO threads call one backend at
    once: each thread gets its own kvtier client, nothing is mixed up."""
    import threading
    pool = host_pool("page_first")
    b = backend(server.url, pool)
    n, threads = 4, 3
    work = []
    for t in range(threads):
        idx = fill(pool, n, seed=20 + t)
        work.append((page_keys(n, "thread%d" % t), idx, pages(pool, idx)))
    errors = []

    def run(keys, idx, want):
        try:
            for _ in range(5):
                assert b.batch_set_v1(keys, idx) == [True] * n
                assert b.batch_exists(keys) == n
                zero(pool, idx)
                assert b.batch_get_v1(keys, idx) == [True] * n
                assert same_bytes(pages(pool, idx), want)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=run, args=w) for w in work]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(b._clients) == threads and b.stats.get("errors", 0) == 0
    b.close()
