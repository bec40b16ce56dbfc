"""Description: /metrics follows Prometheus conventions (`promtool check
metrics` finds nothing), has latency histograms for lookup, retrieve, store
and the L2 operations, and every metric the Grafana dashboard
(dashboards/grafana-kvtier.json) queries exists there.
"""

import json
import os
import re
import shutil
import subprocess

import pytest

from support.data import keys_for, random_payloads
from support.paths import ROOT

DASHBOARD = os.path.join(ROOT, "dashboards", "grafana-kvtier.json")
needs_promtool = pytest.mark.skipif(
    not shutil.which("promtool"),
    reason="promtool not installed (Debian's prometheus package; scripts/install-deps.sh installs it)")


def parse(text):
    """{series line name+labels: value} and {metric: type}."""
    series, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, t = line.split(" ", 3)
            types[name] = t
        elif line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            series[k] = float(v)
    return series, types


@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory):
    """A server's /metrics after stores, lookups and retrieves over ZeroMQ,
    and after a restart, lookups and loads served from L2 (and stores again:
    the counters start at 0 with the process)."""
    from support.server import Server
    tmp = tmp_path_factory.mktemp("metrics")
    s = Server([], tmp, data_dir=str(tmp / "data"))
    s.start()
    try:
        keys = keys_for("metrics-model", 8)
        data = random_payloads(8, 8192)
        with s.client(shm=False, local=False) as c:
            assert c.store(keys, data) == 8
            assert not c.flush().failed
            assert c.lookup(keys) == 8
            assert [bytes(v) for v in c.retrieve(keys)] == data
        s.restart()
        s.wait_recovered()
        with s.client(shm=False, local=False) as c:
            assert c.lookup(keys) == 8  # L2 lookup, then a load into L1
            assert [bytes(v) for v in c.retrieve(keys)] == data
            more = keys_for("metrics-model", 4, seed=1)  # counters restarted: a store too
            assert c.store(more, data[:4]) == 4
            assert not c.flush().failed
        code, text = s.http_get("/metrics")
        assert code == 200
        return text
    finally:
        s.kill()


@needs_promtool
def test_promtool_check_metrics_clean(metrics_text, tmp_path):
    r = subprocess.run(["promtool", "check", "metrics"], input=metrics_text, capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


def test_latency_histograms(metrics_text):
    series, types = parse(metrics_text)
    assert types["kvtier_rpc_latency_seconds"] == "histogram"
    assert types["kvtier_l2_operation_duration_seconds"] == "histogram"

    def check(name, labels):
        buckets = [(k, v) for k, v in series.items()
                   if k.startswith(name + "_bucket{" + labels + ",le=")]
        assert len(buckets) >= 10, (name, labels)
        values = [v for _, v in buckets]
        assert values == sorted(values), buckets  # cumulative
        assert buckets[-1][0].endswith('le="+Inf"}')
        count = series[name + "_count{" + labels + "}"]
        assert values[-1] == count and count > 0, (name, labels, count)
        assert series[name + "_sum{" + labels + "}"] > 0

    for op in ("lookup", "retrieve", "store"):
        check("kvtier_rpc_latency_seconds", 'op="%s"' % op)
    for op in ("store", "lookup", "load"):
        check("kvtier_l2_operation_duration_seconds", 'adapter="fs[0]",op="%s"' % op)


def dashboard_exprs():
    with open(DASHBOARD) as f:
        d = json.load(f)
    exprs = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            exprs.append(("variable " + v["name"], v["query"]))
    return d, exprs


def test_dashboard_queries_name_only_existing_metrics(metrics_text):
    d, exprs = dashboard_exprs()
    assert d["panels"] and len(exprs) >= 10
    series, types = parse(metrics_text)
    present = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", k).group(0) for k in series}
    named = set()
    for title, e in exprs:
        names = set(re.findall(r"\bkvtier_[a-z0-9_]+", e))
        assert names, (title, e)
        named |= names
        missing = names - present
        assert not missing, "%s: %s not in /metrics" % (title, sorted(missing))
    # what the issue asks the dashboard to show
    for m in ("kvtier_hits_total", "kvtier_misses_total", "kvtier_used_bytes",
              "kvtier_evictions_total", "kvtier_l2_rejected_writes_total",
              "kvtier_rpc_latency_seconds_bucket", "kvtier_l2_operation_duration_seconds_bucket"):
        assert m in named, m


@needs_promtool
def test_dashboard_queries_parse_as_promql(tmp_path):
    """Each query as a recording rule: promtool check rules parses its PromQL."""
    _, exprs = dashboard_exprs()
    rules = [{"record": "kvtier:dashboard:%d" % i,
              "expr": e.replace("$instance", ".*")}
             for i, (_, e) in enumerate(exprs) if not e.startswith("label_values(")]
    f = tmp_path / "rules.yml"
    f.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))  # JSON is YAML
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
