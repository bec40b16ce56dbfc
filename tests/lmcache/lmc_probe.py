"""Drive an LMCache MP server (LMCache's own or kvtier --lmcache-port) with
LMCache's own Python client, the way vLLM's LMCacheMPConnector does in
engine-driven mode, and print one JSON line with what it saw.

Usage: python lmc_probe.py tcp://127.0.0.1:PORT|ipc://PATH:PORT [--capture DIR] [--chunks N]
       [--salt S] [--no-clear]
Runs under the venv that has the pinned lmcache package.
"""
import argparse
import json
import os
import sys
import time
import uuid

import msgspec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--capture", default=None, help="write every request's frames here")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--model", default="probe/model")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phase", default="all", choices=["all", "store", "retrieve"])
    ap.add_argument("--salt", default="", help="the keys' cache_salt (a tenant)")
    ap.add_argument("--no-clear", action="store_true", help="skip clear (an admin's call)")
    ap.add_argument("--events", action="store_true",
                    help="subscribe_kv_events before storing; report the records received")
    a = ap.parse_args()

    import torch
    from lmcache.v1.multiprocess.custom_types import (
        IPCCacheServerKey, RegisterEngineDrivenContextPayload)
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory
    from lmcache.v1.multiprocess.transport.zmq_impl import mq

    if a.capture:
        os.makedirs(a.capture, exist_ok=True)
        orig = mq.MessageQueueClient.process_outbound_task
        counter = [0]

        def patched(self):
            sock = self.socket
            real = sock.send_multipart

            def cap(frames, *args, **kw):
                counter[0] += 1
                blob = b"".join(len(f).to_bytes(4, "little") + bytes(f) for f in frames)
                with open(os.path.join(a.capture, "req-%03d" % counter[0]), "wb") as f:
                    f.write(blob)
                return real(frames, *args, **kw)

            sock.send_multipart = cap
            try:
                return orig(self)
            finally:
                sock.send_multipart = real

        mq.MessageQueueClient.process_outbound_task = patched

    T = a.timeout
    out = {}
    c = RequestClientFactory.create(a.url)
    try:
        C = c.get_chunk_size().result(timeout=T)
        out["chunk_size"] = C
        out["noop"] = c.noop().result(timeout=T)
        out["ping"] = c.ping(None).result(timeout=T)
        out["experimental"] = c.get_experimental().result(timeout=T)
        inst = os.getpid()
        L, H = 2, 64
        reg = c.register_kv_cache_engine_driven_context(RegisterEngineDrivenContextPayload(
            instance_id=inst, model_name=a.model, world_size=1, block_size=16,
            num_layers=L, hidden_dim_size=H, dtype_str="float16", use_mla=False,
            num_physical_slots=C)).result(timeout=T)
        out["shm_name"], out["pool_size"] = reg.shm_name, reg.pool_size
        batches = []
        if a.events:  # LMCache's client decodes every batch into its KVEventBatch
            import threading
            stream = c.subscribe_kv_events(inst, a.model, 0, 64)

            def reader():
                try:
                    for b in stream:
                        batches.append(b)
                except Exception as e:  # noqa: BLE001
                    batches.append(e)
            threading.Thread(target=reader, daemon=True).start()
        out["ping_inst"] = c.ping(inst).result(timeout=T)
        from multiprocessing import shared_memory
        from multiprocessing.resource_tracker import unregister
        shm = shared_memory.SharedMemory(name=reg.shm_name.lstrip("/"), create=False)
        unregister("/" + shm.name, "shared_memory")
        g = torch.Generator().manual_seed(a.seed)
        ntok = a.chunks * C + 5
        toks = tuple(int(x) for x in torch.randint(0, 30000, (ntok,), generator=g))
        end = a.chunks * C
        want = [torch.randn(2, L, C, H, generator=g).to(torch.float16) for _ in range(a.chunks)]

        def key(rid, worker, start, stop):
            return IPCCacheServerKey(model_name=a.model, world_size=1, worker_id=worker,
                                     token_ids=toks, start=start, end=stop, request_id=rid,
                                     cache_salt=a.salt, num_kv_readers=1)

        def lookup(rid):
            c.lookup(key(rid, None, 0, end), 1).result(timeout=T)
            deadline = time.time() + T
            while True:
                r = c.query_prefetch_status(rid).result(timeout=T)
                if r is not None:
                    return r
                if time.time() > deadline:
                    return -1
                time.sleep(0.01)

        def view(slot):
            t = torch.frombuffer(shm.buf, dtype=getattr(torch, slot["dtype"]),
                                 count=slot["length"] // 2, offset=slot["offset"])
            return t.view(slot["shape"])

        if a.phase in ("all", "store"):
            rid = "r-" + uuid.uuid4().hex
            out["lookup_cold"] = lookup(rid)
            ps = c.prepare_store(key(rid, 0, 0, end), inst).result(timeout=T)
            slots = ps.context.get("slots", [])
            out["store_slots"] = len(slots)
            out["store_chunk_indices"] = ps.context.get("chunk_indices")
            for s, ci in zip(slots, ps.context.get("chunk_indices", [])):
                view(s).copy_(want[ci])
            out["commit_store"] = c.commit_store(key(rid, 0, 0, end), inst, b"").result(timeout=T)
            c.end_session(rid).result(timeout=T)
            # a second store of the same chunks: nothing to write
            rid = "r-" + uuid.uuid4().hex
            ps2 = c.prepare_store(key(rid, 0, 0, end), inst).result(timeout=T)
            out["restore_slots"] = len(ps2.context.get("slots", []))
            c.end_session(rid).result(timeout=T)
        if a.phase in ("all", "retrieve"):
            rid = "r-" + uuid.uuid4().hex
            deadline = time.time() + T
            hits = lookup(rid)
            while hits < a.chunks and time.time() < deadline and a.phase == "retrieve":
                c.end_session(rid).result(timeout=T)
                rid = "r-" + uuid.uuid4().hex
                time.sleep(0.05)
                hits = lookup(rid)
            out["lookup_warm"] = hits
            pr = c.prepare_retrieve(key(rid, 0, 0, hits * C), inst).result(timeout=T)
            out["retrieve_success"] = pr.success
            slots = pr.context.get("slots", [])
            out["retrieve_slots"] = len(slots)
            out["identical"] = bool(slots) and all(
                torch.equal(view(s), want[i]) for i, s in enumerate(slots))
            out["commit_retrieve"] = c.commit_retrieve(key(rid, 0, 0, hits * C), inst).result(timeout=T)
            c.free_lookup_locks(key(rid, None, 0, end), 1).result(timeout=T)
            out["end_session"] = c.end_session(rid).result(timeout=T)
            # a lookup for tokens never stored
            rid = "r-" + uuid.uuid4().hex
            toks_saved = toks
            toks = tuple(t + 1 for t in toks_saved)
            out["lookup_miss"] = lookup(rid)
            c.end_session(rid).result(timeout=T)
            toks = toks_saved
            # wait_prefetch_status on an unknown id answers 0
            out["wait_unknown"] = c.wait_prefetch_status("nope-" + rid, 0.1).result(timeout=T)
        out["report_block_allocation"] = c.report_block_allocation(inst, a.model, []).result(timeout=T)
        if not a.no_clear:
            out["clear"] = c.clear(False).result(timeout=T)
        if a.events:
            time.sleep(1.0)  # the removals of clear
            stream.close()
            out["event_batches"] = [
                repr(b) if isinstance(b, Exception) else
                {"enabled": b.enabled, "lost": b.lost, "next_cursor": b.next_cursor,
                 "incarnation": b.incarnation,
                 "events": [{"seq": r.seq, "kind": r.kind, "medium": r.medium,
                             "model_name": r.model_name,
                             "block_hashes": [h.hex() for h in r.block_hashes],
                             "parent": r.parent_block_hash.hex() if r.parent_block_hash else None,
                             "token_ids": list(r.token_ids)} for r in b.events]}
                for b in batches]
            out["tokens"] = list(toks)
        out["unregister"] = c.unregister_kv_cache_engine_driven_context(inst).result(timeout=T)
        del view
        shm.close()
    except Exception as e:  # noqa: BLE001
        out["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        c.close()
    print("PROBE " + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
