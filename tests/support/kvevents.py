"""A KV-events subscriber built on the pinned vLLM's own event classes: every
message is decoded as vLLM decodes it (msgspec, vllm.distributed.kv_events.
KVEventBatch), so a batch vLLM's consumers could not read fails the test.
Runs in the vLLM venv (tests/vllm)."""

import time

import msgspec
import zmq
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        KVEventBatch)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)


def decode(payload):
    """vLLM's decoding of one batch: a KVEventBatch or an exception."""
    return DECODER.decode(payload)


class Subscriber:
    """A SUB socket on a kvtier server's --kv-events-endpoint, and its
    replay socket. batches: {seq: KVEventBatch} of everything received."""

    def __init__(self, endpoint, replay=None, topic=b"", rcvhwm=None):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_ep = replay
        self.topics = set()
        self.batches = {}

    def close(self):
        self.ctx.destroy(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def _take(self, topic, seq, payload):
        self.topics.add(topic)
        self.batches[int.from_bytes(seq, "big")] = decode(payload)

    def poll(self, timeout=0.3):
        """Read what arrives until nothing came for timeout seconds."""
        while self.sub.poll(int(timeout * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            self._take(topic, seq, payload)

    def replay(self, start=0, timeout=5):
        """Ask the replay socket for every batch from start on; returns the
        sequence numbers replayed (and keeps the batches)."""
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.replay_ep)
        d.send_multipart([b"", start.to_bytes(8, "big")])
        got = []
        try:
            while True:
                if not d.poll(int(timeout * 1000)):
                    raise TimeoutError("no end marker from the replay socket")
                empty, topic, seq, payload = d.recv_multipart()
                assert empty == b""
                if seq == END_SEQ:
                    assert topic == b"" and payload == b""
                    return got
                got.append(int.from_bytes(seq, "big"))
                self._take(topic, seq, payload)
        finally:
            d.close(linger=0)

    def wait(self, pred, timeout=15, what="events"):
        """Poll until pred(self) is true."""
        end = time.time() + timeout
        while time.time() < end:
            self.poll(0.1)
            if pred(self):
                return
        raise AssertionError("timed out waiting for %s; view: %s" % (what, self.view()))

    def events(self):
        """(seq, event) in sequence order."""
        for s in sorted(self.batches):
            for e in self.batches[s].events:
                yield s, e

    def view(self):
        """medium -> set of block hashes held, replaying every event in
        sequence order (AllBlocksCleared empties everything)."""
        held = {}
        for _, e in self.events():
            if isinstance(e, AllBlocksCleared):
                held = {}
            elif isinstance(e, BlockStored):
                held.setdefault(e.medium, set()).update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held.setdefault(e.medium, set()).difference_update(e.block_hashes)
        return {m: h for m, h in held.items() if h}

    def removed(self, medium):
        out = set()
        for _, e in self.events():
            if isinstance(e, BlockRemoved) and e.medium == medium:
                out.update(e.block_hashes)
        return out
