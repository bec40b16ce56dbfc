"""Configuration of the persistent adapters: every seed --l2-adapter example
for nixl_store, nixl_store_dynamic, fs_native, raw_block, dax and mock passes
`kvtier server --dry-run` as written, except what this build cannot serve
(GDS/GDS_MT without cuFile, NIXL object backends), which is refused with
exit 2 and what to use instead; each field error of the seeds' field lists
gets its own message naming the adapter index, type and field."""

import json

import pytest

from support.server import run_kvtier

# The examples exactly as the seed documents print them.
SEED_OK = [
    '{"type": "nixl_store", "backend": "POSIX", "backend_params": {"file_path": "/data/lmcache/l2", "use_direct_io": "false"}, "pool_size": 64}',
    '{"type": "nixl_store", "backend": "HF3FS", "backend_params": {"file_path": "/mnt/hf3fs/lmcache", "use_direct_io": "false"}, "pool_size": 64}',
    '{"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": {"file_path": "/data/lmcache/l2", "use_direct_io": "false", "max_capacity_gb": "10"}}',
    '{"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": {"file_path": "/data/lmcache/l2", "use_direct_io": "false", "max_capacity_gb": "10"}, "persist_enabled": false}',
    '{"type": "fs_native", "base_path": "/data/lmcache/l2"}',
    '{"type": "fs_native", "base_path": "/data/lmcache/l2", "num_workers": 32}',
    '{"type": "fs_native", "base_path": "/data/lmcache/l2", "num_workers": 32, "use_odirect": true}',
    '{"type": "raw_block", "device_path": "/dev/nvme0n1", "slot_bytes": 1048576, "block_align": 4096, "header_bytes": 4096, "meta_total_bytes": 268435456, "use_odirect": true, "num_store_workers": 2, "num_lookup_workers": 1, "num_load_workers": 4}',
    '{"type": "raw_block", "device_path": "/dev/nvme0n1", "slot_bytes": 1048576, "io_engine": "io_uring", "iouring_queue_depth": 256, "use_odirect": true}',
    '{"type": "raw_block", "device_path": "/dev/nvme0n1", "slot_bytes": 1048576, "load_checkpoint_on_init": false, "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.9, "eviction_ratio": 0.1}}',
    '''{
  "type": "dax",
  "device_path": "/dev/dax1.0",
  "max_dax_size_gb": 100,
  "slot_bytes": 268435456,
  "num_store_workers": 1,
  "num_lookup_workers": 1,
  "num_load_workers": 4,
  "eviction": {
    "eviction_policy": "LRU",
    "trigger_watermark": 0.9,
    "eviction_ratio": 0.1
  }
}''',
    '{"type": "mock", "max_size_gb": 256, "mock_bandwidth_gb": 10}',
    '''{
  "type": "nixl_store",
  "backend": "POSIX",
  "backend_params": {"file_path": "/data/lmcache/l2", "use_direct_io": "false"},
  "pool_size": 128,
  "eviction": {
    "eviction_policy": "LRU",
    "trigger_watermark": 0.8,
    "eviction_ratio": 0.2
  }
}''',
]

SEED_REFUSED = [
    ('{"type": "nixl_store", "backend": "GDS", "backend_params": {"file_path": "/data/nvme/lmcache", "use_direct_io": "true"}, "pool_size": 128}',
     ["GDS", "cuFile", "\"POSIX\""]),
    ('{"type": "nixl_store", "backend": "GDS_MT", "backend_params": {"file_path": "/data/nvme/lmcache", "use_direct_io": "true"}, "pool_size": 128}',
     ["GDS_MT", "cuFile", "\"POSIX\""]),
    ('{"type": "nixl_store_dynamic", "backend": "GDS", "backend_params": {"file_path": "/data/nvme/l2", "use_direct_io": "true", "max_capacity_gb": "50"}, "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.9, "eviction_ratio": 0.1}}',
     ["GDS", "cuFile", "\"POSIX\""]),
    ('''{
  "type": "nixl_store",
  "backend": "GDS",
  "backend_params": {"file_path": "/data/nvme/l2", "use_direct_io": "true"},
  "pool_size": 256,
  "eviction": {
    "eviction_policy": "LRU",
    "trigger_watermark": 0.9,
    "eviction_ratio": 0.1
  }
}''', ["GDS", "cuFile"]),
]


def dry(*specs, extra=()):
    args = ["server", "--dry-run", "--no-storage-check"] + list(extra)  # seed paths: not here
    for s in specs:
        args += ["--l2-adapter", s]
    return run_kvtier(*args)


@pytest.mark.parametrize("spec", SEED_OK)
def test_seed_examples_pass_dry_run(spec):
    r = dry(spec)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["l2_adapters"][0]
    assert out["type"] == json.loads(spec)["type"]


@pytest.mark.parametrize("spec,words", SEED_REFUSED)
def test_what_this_build_cannot_serve_is_refused(spec, words):
    r = dry(spec)
    assert r.returncode == 2, (spec, r.stdout)
    assert "--l2-adapter #0" in r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_cascade_example_refused_at_the_gds_adapter():
    # the seed's "SSD + NVMe GDS" cascade: the second adapter is the one refused
    r = dry('{"type": "nixl_store", "backend": "POSIX", "backend_params": {"file_path": "/data/ssd/l2", "use_direct_io": "false"}, "pool_size": 64}',
            '{"type": "nixl_store", "backend": "GDS", "backend_params": {"file_path": "/data/nvme/l2", "use_direct_io": "true"}, "pool_size": 128}')
    assert r.returncode == 2 and "--l2-adapter #1 (nixl_store)" in r.stderr and "cuFile" in r.stderr


def test_resolved_defaults():
    r = dry(SEED_OK[7], SEED_OK[2], SEED_OK[10])
    assert r.returncode == 0, r.stderr
    rb, nd, dax = json.loads(r.stdout)["l2_adapters"]
    assert rb["meta_magic"] == "LMCIDX01" and rb["meta_version"] == 1
    assert rb["meta_checkpoint_interval_sec"] == 60 and rb["meta_idle_quiet_ms"] == 100
    assert rb["io_engine"] == "posix" and rb["iouring_queue_depth"] == 256
    assert rb["load_checkpoint_on_init"] is True and rb["enable_zero_copy"] is True
    assert nd["backend_params"]["use_direct_io"] is False
    assert nd["backend_params"]["max_capacity_gb"] == 10 and nd["persist_enabled"] is True
    assert nd["io_engine"] == "posix"
    assert dax["num_load_workers"] >= 1 and dax["slot_bytes"] == 268435456


def test_strings_true_false_read_as_meant():
    for val, want in [('"false"', False), ('"FALSE"', False), ('"true"', True), ("false", False)]:
        spec = ('{"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": '
                '{"file_path": "/d", "use_direct_io": %s, "max_capacity_gb": 1, "shard_dirs": %s}, '
                '"persist_enabled": %s}' % (val, val, val))
        r = dry(spec)
        assert r.returncode == 0, r.stderr
        a = json.loads(r.stdout)["l2_adapters"][0]
        assert a["persist_enabled"] is want
        assert a["backend_params"]["use_direct_io"] is want
        assert a["backend_params"]["shard_dirs"] is want


NIXL = '"backend": "POSIX", "backend_params": {"file_path": "/d", "use_direct_io": "false"%s}'
ND = '{"type": "nixl_store_dynamic", ' + NIXL % ', "max_capacity_gb": 1' + '%s}'
NS = '{"type": "nixl_store", ' + NIXL % '' + ', "pool_size": 4%s}'

FIELD_ERRORS = [
    # nixl_store / nixl_store_dynamic
    ('{"type": "nixl_store", "pool_size": 4, "backend_params": {"file_path": "/d"}}', '"backend" is required'),
    ('{"type": "nixl_store", "backend": "NVME", "backend_params": {"file_path": "/d"}, "pool_size": 4}',
     '"backend" must be one of POSIX, GDS, GDS_MT, HF3FS, OBJ, AZURE_BLOB'),
    ('{"type": "nixl_store", "backend": "POSIX", "backend_params": {"file_path": "/d"}}', '"pool_size" is required'),
    ('{"type": "nixl_store", "backend": "POSIX", "backend_params": {"file_path": "/d"}, "pool_size": 0}',
     '"pool_size" must be between 1'),
    ('{"type": "nixl_store", "backend": "POSIX", "pool_size": 4}', '"backend_params" is required'),
    ('{"type": "nixl_store", "backend": "POSIX", "backend_params": {"use_direct_io": "true"}, "pool_size": 4}',
     '"backend_params.file_path" is required'),
    (NS.replace('"use_direct_io": "false"', '"use_direct_io": "maybe"') % '', '"backend_params.use_direct_io" must be true or false'),
    (NS.replace('"false"}', '"false", "file_size": 5000}') % '', '"backend_params.file_size" must be a multiple of page_size'),
    (NS.replace('"false"}', '"false", "bogus": 1}') % '', '"backend_params.bogus" is not a known field'),
    (NS % ', "io_engine": "aio"', '"io_engine" must be one of posix, io_uring'),
    ('{"type": "nixl_store_dynamic", ' + NIXL % '' + '}', '"backend_params.max_capacity_gb" is required'),
    ('{"type": "nixl_store_dynamic", ' + NIXL % ', "max_capacity_gb": 0' + '}', '"backend_params.max_capacity_gb" must be > 0'),
    ('{"type": "nixl_store_dynamic", ' + NIXL % ', "max_capacity_gb": "ten"' + '}', '"backend_params.max_capacity_gb" must be a number'),
    (ND.replace('"max_capacity_gb": 1', '"max_capacity_gb": 1, "shard_dirs": "yes"') % '', '"backend_params.shard_dirs" must be true or false'),
    (ND % ', "persist_enabled": 0', '"persist_enabled" must be true or false'),
    ('{"type": "nixl_store_dynamic", "backend": "OBJ", "backend_params": {}}', 'file backends only'),
    (ND % ', "num_workers": 0', '"num_workers" must be between 1'),
    # fs_native
    ('{"type": "fs_native"}', '"base_path" is required'),
    ('{"type": "fs_native", "base_path": "/d", "num_workers": 0}', '"num_workers" must be between 1'),
    ('{"type": "fs_native", "base_path": "/d", "num_workers": "many"}', '"num_workers" must be an integer'),
    ('{"type": "fs_native", "base_path": "/d", "use_odirect": "yes"}', '"use_odirect" must be true or false'),
    ('{"type": "fs_native", "base_path": "/d", "read_ahead_size": 0}', '"read_ahead_size" must be between 1'),
    ('{"type": "fs_native", "base_path": "/d", "max_capacity_gb": -1}', '"max_capacity_gb" must be between 0'),
    ('{"type": "fs_native", "base_path": "/d", "relative_tmp_dir": "../x"}', '"relative_tmp_dir" must be a single directory'),
    # raw_block
    ('{"type": "raw_block", "slot_bytes": 1048576}', '"device_path" is required'),
    ('{"type": "raw_block", "device_path": "/dev/x"}', '"slot_bytes" is required'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 0}', '"slot_bytes" must be between 1'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1000000}', '"slot_bytes" must be a multiple of block_align 4096'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "header_bytes": 5000}', '"header_bytes" must be a multiple of block_align'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "block_align": 512, "header_bytes": 512}', '"header_bytes" must be at least 1024'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "meta_total_bytes": 100000}', '"meta_total_bytes" must be a multiple of block_align'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 4294963200}', '"slot_bytes" must be at most 4294959104: a slot of slot_bytes plus header_bytes'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "capacity_bytes": 1048576, "meta_total_bytes": 1048576}',
     '"capacity_bytes" must hold meta_total_bytes 1048576 plus one slot of 1052672'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "block_align": 3000}', '"block_align" must be a power of two'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "persist_enabled": "false"}', '"persist_enabled" must stay true'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "per_tp_device_paths": ["/dev/a"]}', '"per_tp_device_paths" is not supported'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "io_engine": "spdk"}', '"io_engine" must be one of posix, io_uring'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "iouring_queue_depth": 0}', '"iouring_queue_depth" must be between 1'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "num_store_workers": 0}', '"num_store_workers" must be between 1'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "num_lookup_workers": 0}', '"num_lookup_workers" must be between 1'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "num_load_workers": -1}', '"num_load_workers" must be between 1'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "use_uring_cmd": true}', '"use_uring_cmd" requires "io_engine": "io_uring"'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "meta_magic": "SHORT"}', '"meta_magic" must be exactly 8'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "meta_enable_periodic": "sometimes"}', '"meta_enable_periodic" must be true or false'),
    ('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, "meta_total_bytes": 32768}', '"meta_total_bytes" must hold at least 16 blocks'),
    # dax
    ('{"type": "dax", "max_dax_size_gb": 1, "slot_bytes": 4096}', '"device_path" is required'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "slot_bytes": 4096}', '"max_dax_size_gb" is required'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "max_dax_size_gb": 0, "slot_bytes": 4096}', '"max_dax_size_gb" must be a positive number'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "max_dax_size_gb": 1}', '"slot_bytes" is required'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "max_dax_size_gb": 1, "slot_bytes": 0}', '"slot_bytes" must be between 1'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "max_dax_size_gb": 0.001, "slot_bytes": 268435456}', '"slot_bytes" is larger than the configured DAX arena'),
    ('{"type": "dax", "device_path": "/dev/dax1.0", "max_dax_size_gb": 1, "slot_bytes": 4096, "num_load_workers": 0}', '"num_load_workers" must be between 1'),
]


@pytest.mark.parametrize("spec,msg", FIELD_ERRORS)
def test_each_field_error_has_its_message(spec, msg):
    r = dry(spec)
    assert r.returncode == 2, (spec, r.stdout)
    t = json.loads(spec)["type"]
    assert "--l2-adapter #0 (%s)" % t in r.stderr, r.stderr
    assert msg in r.stderr, (msg, r.stderr)


def test_uring_cmd_is_refused_with_an_alternative():
    r = dry('{"type": "raw_block", "device_path": "/dev/x", "slot_bytes": 1048576, '
            '"io_engine": "io_uring", "use_uring_cmd": true}')
    assert r.returncode == 2 and "NVMe passthrough" in r.stderr and '"io_engine": "io_uring"' in r.stderr
