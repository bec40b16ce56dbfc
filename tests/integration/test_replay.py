"""kvtier replay against a real server: the live L1 hits what the
same policy hits replayed offline, for every policy, on a Mooncake-format
trace with requests longer than any fixed cap (a request is sent whole, as
the offline model takes it), and bad input exits 2 with the option or line
named."""
import json
import random

import pytest

from support.server import run_kvtier

POLICIES = ["LRU", "ARC", "LFU", "value", "adaptive"]
BLOCK = 4096  # the L1's alignment: a block is one aligned object


def write_trace(path, seed=7, requests=300):
    """Conversations over a few long shared documents: a request is the
    document (620 blocks for the longest), the session's history and a new
    turn, so requests reach some 980 blocks, more than the 512 the live
    replay once cut them to. Mooncake format: one JSON object per line,
    hash_ids prefix-aware."""
    r = random.Random(seed)
    nxt = [0]

    def new(n):
        ids = list(range(nxt[0], nxt[0] + n))
        nxt[0] += n
        return ids

    docs = [new(n) for n in (620, 300, 90, 40)]
    sessions = []
    t = 0
    with open(path, "w") as f:
        for _ in range(requests):
            t += r.randint(50, 400)
            if not sessions or r.random() < 0.3:
                sessions.append(list(r.choice(docs)))
                if len(sessions) > 12:
                    sessions.pop(0)
            s = r.choice(sessions)
            s += new(r.randint(10, 60))
            f.write(json.dumps({"timestamp": t, "input_length": 512 * len(s), "output_length": 10,
                                "hash_ids": s}) + "\n")


def offline(trace, budget):
    r = run_kvtier("replay", "--trace", trace, "--offline", "--json", "--budget-blocks",
                   str(budget), "--block-bytes", str(BLOCK), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("pct", [10, 25])
def test_live_l1_hits_as_the_policy_does_offline(make_server, tmp_path, pct):
    trace = str(tmp_path / "docs.jsonl")
    write_trace(trace)
    reqs = [json.loads(x)["hash_ids"] for x in open(trace)]
    assert max(map(len, reqs)) > 512
    unique = len({b for ids in reqs for b in ids})
    budget = unique * pct // 100
    info = offline(trace, budget)
    assert info["unique_blocks"] == unique
    off = info["offline"]["policies"]
    assert set(POLICIES) <= set(off), off
    # the L1 holds exactly `budget` blocks and evicts only when full
    gb = budget * BLOCK / 2**30
    for pol in [p for p in off if p != "Belady"]:  # every policy replay compares
        s = make_server(["--no-l2", "--l1-size-gb", "%.12f" % gb, "--l1-init-size-gb", "%.12f" % gb,
                         "--eviction-policy", pol, "--eviction-trigger-watermark", "1.0"])
        r = run_kvtier("replay", "--url", s.url, "--trace", trace, "--block-bytes", str(BLOCK),
                       "--budget-blocks", str(budget), "--json", timeout=300)
        s.kill()
        assert r.returncode == 0, r.stderr
        assert "warning" not in r.stderr, r.stderr  # the same cache live and offline
        live = json.loads(r.stdout)["live"]
        assert live["wrong_blocks"] == 0 and live["errors"] == 0, (pol, live)
        assert live["server_l1_blocks"] == budget
        want = off[pol]["prefix_hit_ratio"]
        # live = offline within 0.2 points for the same policy
        assert abs(live["prefix_hit_ratio"] - want) <= 0.002, (pol, pct, live["prefix_hit_ratio"],
                                                                want)
        assert 0 < want <= off["Belady"]["prefix_hit_ratio"] + 1e-9


@pytest.mark.parametrize("args,what", [
    (["--budget-blocks", "abc"], "--budget-blocks: 'abc'"),
    (["--budget-blocks", "0"], "--budget-blocks: '0'"),
    (["--block-bytes", "-5"], "--block-bytes: '-5'"),
    (["--block-bytes", "4k"], "--block-bytes: '4k'"),
    (["--limit", "ten"], "--limit: 'ten'"),
    (["--value-half-life", "soon"], "--value-half-life: 'soon'"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_options_exit_2_naming_the_option(tmp_path, args, what):
    trace = str(tmp_path / "t.jsonl")
    write_trace(trace, requests=5)
    r = run_kvtier("replay", "--trace", trace, "--offline", *args)
    assert r.returncode == 2 and what in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == ""


@pytest.mark.parametrize("lines,what", [
    (['{"hash_ids": [1, 2]}', '{"hash_ids": [1, "x"]}'], "t.jsonl:2: hash_ids[1] is not a block id"),
    (['{"hash_ids": [-3]}'], "t.jsonl:1: hash_ids[0] is not a block id"),
    (['{"timestamp": 1}'], "t.jsonl:1: not a trace line"),
    (['{"hash_ids": []}'], "no request with a block in it"),
    ([], "no request with a block in it"),
])
def test_bad_traces_exit_2_naming_the_line(tmp_path, lines, what):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(x + "\n" for x in lines))
    r = run_kvtier("replay", "--trace", str(trace), "--offline")
    assert r.returncode == 2 and what in r.stderr, (r.returncode, r.stderr)


def test_says_when_the_server_is_not_the_offline_cache(make_server, tmp_path):
    """Against a server whose L1 holds another number of blocks, evicts from
    its watermark and has an L2, the replay still runs and says on stderr
    each reason live and offline differ."""
    trace = str(tmp_path / "docs.jsonl")
    write_trace(trace, requests=20)
    s = make_server(["--l1-size-gb", "0.01", "--l2-adapter",
                     json.dumps({"type": "fs", "base_path": str(tmp_path / "l2")})])
    r = run_kvtier("replay", "--url", s.url, "--trace", trace, "--block-bytes", str(BLOCK),
                   "--budget-blocks", "100", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    held = json.loads(r.stdout)["live"]["server_l1_blocks"]
    assert abs(held - 0.01 * 2**30 / BLOCK) <= 1, held  # 10 MiB of 4 KiB blocks
    assert "the server's L1 holds %d blocks" % held in r.stderr
    assert "the offline model 100 (--budget-blocks)" in r.stderr
    assert "evicts from 80% full" in r.stderr
    assert "1 L2 adapter(s)" in r.stderr


def test_live_replay_deletes_what_it_stored_unless_keep(make_server, tmp_path):
    """A live replay stores the blocks it misses in the server's cache, L2
    included; at the end it deletes every block of the trace from the
    server (nothing is left in L1 or in the L2 directory), and --keep
    leaves them. The help says so, with the size of the shared Mooncake trace."""
    import os
    trace = str(tmp_path / "docs.jsonl")
    write_trace(trace, requests=20)
    l2 = tmp_path / "l2"
    s = make_server(["--l2-adapter", json.dumps({"type": "fs", "base_path": str(l2)})])
    r = run_kvtier("replay", "--url", s.url, "--trace", trace, "--block-bytes", str(BLOCK),
                   "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    unique = out["unique_blocks"]
    assert out["live"]["blocks_stored"] > 0
    assert out["live"]["cleanup"] == {"deleted_keys": unique, "l2_removed": unique, "errors": 0}
    with s.client() as c:
        st = c.status()
    assert st["l1"]["objects"] == 0 and st["l2"][0]["objects"] == 0, (st["l1"], st["l2"][0])
    assert not [f for f in os.listdir(l2) if f.endswith(".data")]
    # --keep: what it stored stays (every unique block: the cache was empty)
    r = run_kvtier("replay", "--url", s.url, "--trace", trace, "--block-bytes", str(BLOCK),
                   "--keep", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "kept the stored blocks in the server under the model 'replay' (--keep)" in r.stdout
    with s.client() as c:
        assert c.status()["l2"][0]["objects"] == unique
    # a second replay without --keep deletes them, and says how many
    r = run_kvtier("replay", "--url", s.url, "--trace", trace, "--block-bytes", str(BLOCK),
                   timeout=120)
    assert r.returncode == 0, r.stderr
    assert ("deleted the trace's %d blocks (model 'replay') from the server: %d objects removed "
            "from L2" % (unique, unique)) in r.stdout, r.stdout
    with s.client() as c:
        assert c.status()["l2"][0]["objects"] == 0
    h = run_kvtier("replay", "--help")
    assert "720 MB" in h.stdout and "--keep" in h.stdout and "persistent" in h.stdout, h.stdout
