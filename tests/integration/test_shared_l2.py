"""Several kvtier servers ("nodes") on one L2: a real S3 server (versitygw)
and one shared directory (nixl_store_dynamic "shared": true, as on HF3FS);
the Redis Cluster case is in test_resp_cluster.py and uses the same
workload. Three servers store, load and delete the same keys at once from
three threads, one of them also evicting under a small cap: every load
through any server is a miss or the key's own bytes, never another's, and
the servers do find each other's chunks."""

from support.data import adapter_json
from support.s3_servers import s3_json, start_s3
from support.shared_l2 import EVICT, L1, check_nodes, shared_workload


def test_three_servers_one_bucket(make_server, tmp_path):
    srv = start_s3("versitygw", tmp_path)
    try:
        capped = s3_json(srv, max_capacity_gb=0.0005, eviction=EVICT)  # ~512 KiB: ~15 chunks
        servers = [make_server(L1 + ["--l2-adapter", capped])] + \
            [make_server(L1 + ["--l2-adapter", s3_json(srv)]) for _ in range(2)]
        for s in servers:
            s.wait_recovered()
        tally = shared_workload(servers)
        check_nodes(servers, tally)
    finally:
        srv.kill()


def test_three_servers_one_shared_directory(make_server, tmp_path):
    d = tmp_path / "hf3fs"
    d.mkdir()

    def spec(cap, **kw):
        return adapter_json(type="nixl_store_dynamic", backend="POSIX", shared=True,
                            backend_params={"file_path": str(d), "max_capacity_gb": cap}, **kw)

    servers = [make_server(L1 + ["--l2-adapter", spec(0.0005, eviction=EVICT)])] + \
        [make_server(L1 + ["--l2-adapter", spec(1)]) for _ in range(2)]
    for s in servers:
        s.wait_recovered()
    tally = shared_workload(servers)
    st = check_nodes(servers, tally)
    assert all(a["shared"] for a in st)
