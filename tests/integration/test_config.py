"""Server configuration: a bad --l2-adapter spec or flag exits 2 naming
the adapter and the key (a mistyped key with the nearest known one), the
seeds' persist_enabled strings parse, and --dry-run prints the resolved
configuration with its numbers and sizes as meant."""

import json
import os

import pytest

from support.data import adapter_json
from support.server import run_kvtier

MiB = 1 << 20


BAD_ADAPTER_SPECS = [
    ("not json", "invalid JSON"),
    ('{"type": "nope"}', "unknown type \"nope\""),
    ('[1]', "must be a JSON object"),
    ('{"base_path": "/x"}', "\"type\" is missing"),
    ('{"type": "fs"}', "\"base_path\" is required"),
    ('{"type": "fs", "base_path": "/x", "use_odirect": "yes"}', "\"use_odirect\" must be true or false"),
    ('{"type": "fs", "base_path": "/x", "use_odirect": 1}', "\"use_odirect\" must be true or false"),
    ('{"type": "fs", "base_path": "/x", "max_capacity_gb": "lots"}', "\"max_capacity_gb\" must be a number"),
    ('{"type": "fs", "base_path": "/x", "read_ahead_size": -1}', "\"read_ahead_size\" must be between"),
    ('{"type": "fs", "base_path": "/x", "bogus": 1}', "\"bogus\" is not a known field"),
    ('{"type": "fs", "base_path": "/x", "eviction": {"eviction_policy": "MRU"}}', "unknown policy"),
    ('{"type": "fs", "base_path": "/x", "relative_tmp_dir": "../out"}', "\"relative_tmp_dir\""),
    ('{"type": "mock", "max_size_gb": 0, "mock_bandwidth_gb": 1}', "\"max_size_gb\" must be > 0"),
]


@pytest.mark.parametrize("spec,msg", BAD_ADAPTER_SPECS)
def test_bad_config_exits_2_naming_the_key(spec, msg):
    r = run_kvtier("server", "--dry-run", "--l2-adapter", '{"type":"mock","max_size_gb":1,"mock_bandwidth_gb":1}',
                   "--l2-adapter", spec)
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #1" in r.stderr and msg in r.stderr, (spec, r.stderr)


TYPO_SPECS = [
    # a required key mistyped: the typo is named, with the key it is near
    ('{"type": "fs", "base_pth": "/x"}',
     '"base_pth" is not a known field: did you mean "base_path"? ("base_path" is required)'),
    ('{"type": "nixl_store_dynamic", "backend": "POSIX", "backend_params": {"file_path": "/x", '
     '"max_capacty_gb": 10}}',
     '"backend_params.max_capacty_gb" is not a known field: did you mean '
     '"backend_params.max_capacity_gb"? ("backend_params.max_capacity_gb" is required)'),
    ('{"type": "nixl_store", "backend": "OBJ", "backend_params": {"buckt": "b"}, "pool_size": 4}',
     '"backend_params.buckt" is not a known field: did you mean "backend_params.bucket"?'),
    ('{"type": "resp", "hots": "127.0.0.1"}', '"hots" is not a known field: did you mean "host"?'),
    ('{"type": "fs", "Base_Path": "/x"}', '"Base_Path" is not a known field: did you mean "base_path"?'),
    # an optional key mistyped: the nearest known one beside the list
    ('{"type": "fs", "base_path": "/x", "use_odirec": true}',
     '"use_odirec" is not a known field: did you mean "use_odirect"? (known: '),
    # nothing near: no guess
    ('{"type": "fs", "zzz": "/x"}', '"base_path" is required'),
    ('{"type": "fs", "base_path": "/x", "bogus": 1}', '"bogus" is not a known field (known: '),
]


@pytest.mark.parametrize("spec,msg", TYPO_SPECS)
def test_typo_of_a_key_names_it_and_the_nearest_known_one(spec, msg):
    env = {k: v for k, v in os.environ.items() if k != "AWS_DEFAULT_BUCKET"}
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter", spec, env=env)
    assert r.returncode == 2, (spec, r.stderr)
    assert "--l2-adapter #0" in r.stderr and msg in r.stderr, (spec, r.stderr)
    if "zzz" in spec or "bogus" in spec:
        assert "did you mean" not in r.stderr


@pytest.mark.parametrize("args", [["--l1-size-gb", "abc"], ["--eviction-ratio", "2"], ["--port", "0"],
                                  ["--l2-store-policy", "sometimes"], ["--eviction-policy", "MRU"],
                                  ["--no-such-flag"]])
def test_bad_flag_exits_2_naming_it(args):
    r = run_kvtier("server", "--dry-run", *args)
    assert r.returncode == 2 and args[0] in r.stderr, (args, r.stderr)


def test_persist_enabled_strings(tmp_path):
    for val, want in [('"false"', False), ('"False"', False), ("false", False), ('"true"', True), ("true", True)]:
        spec = '{"type": "fs", "base_path": "%s", "persist_enabled": %s}' % (tmp_path, val)
        r = run_kvtier("server", "--dry-run", "--l2-adapter", spec)
        assert r.returncode == 0, r.stderr
        cfg = json.loads(r.stdout)
        assert cfg["l2_adapters"][0]["persist_enabled"] is want
    r = run_kvtier("server", "--dry-run", "--l2-adapter",
                   '{"type": "fs", "base_path": "/x", "persist_enabled": 0}')
    assert r.returncode == 2 and "persist_enabled" in r.stderr


def test_dry_run_prints_resolved_config(tmp_path):
    r = run_kvtier("server", "--dry-run", "--no-storage-check", "--l2-adapter",
                   '{"type": "fs", "base_path": "/data/lmcache/l2", "use_odirect": true}')
    assert r.returncode == 0, r.stderr
    cfg = json.loads(r.stdout)
    a = cfg["l2_adapters"][0]
    assert a["type"] == "fs" and a["use_odirect"] is True and a["relative_tmp_dir"] == ""
    # L1 default: adaptive (docs/eviction.md, "Choosing a policy")
    assert cfg["l1"]["eviction_policy"] == "adaptive" and cfg["bind"] == "tcp://127.0.0.1:5555"


def test_dry_run_numbers_and_sizes_as_meant(tmp_path):
    r = run_kvtier("server", "--dry-run", "--l1-size-gb", "0.25", "--data-dir", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "0000000000" not in r.stdout, r.stdout
    assert '"eviction_trigger_watermark": 0.8,' in r.stdout, r.stdout
    l1 = json.loads(r.stdout)["l1"]
    assert l1["init_size_gb"] == 0.25 and l1["size_gb"] == 0.25
    ns = adapter_json(type="nixl_store", backend="POSIX", pool_size=64,
                      backend_params={"file_path": str(tmp_path / "ns")})
    r = run_kvtier("server", "--dry-run", "--l2-adapter", ns)
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["l2_adapters"][0]
    assert a["persist_enabled"] is False and a["preallocated_bytes"] == 64 * 16 * MiB, a
    q = adapter_json(type="fs", base_path=str(tmp_path / "d"),
                     namespace_quotas=str(tmp_path / "missing.json"))
    r = run_kvtier("server", "--dry-run", "--l2-adapter", q)
    assert r.returncode == 2 and "missing.json" in r.stderr and "line -1" not in r.stderr, r.stderr
