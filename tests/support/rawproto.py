"""Raw protocol clients for tests: a pyzmq DEALER and a raw AF_UNIX socket
speaking the same-host framing of docs/protocol.md, and a small msgpack codec
(the test machine has no msgpack module). Requests sent with these reach the
server as written: none of the C client's own checks apply."""

import socket
import struct

import zmq

# ------------------------------------------------------------ tiny msgpack


def mp_pack(o):
    if o is None:
        return b"\xc0"
    if o is True:
        return b"\xc3"
    if o is False:
        return b"\xc2"
    if isinstance(o, int):
        if 0 <= o < 128:
            return bytes([o])
        if o >= 0:
            return b"\xcf" + struct.pack(">Q", o)
        if o >= -32:
            return struct.pack("b", o)
        return b"\xd3" + struct.pack(">q", o)
    if isinstance(o, str):
        b = o.encode()
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if isinstance(o, (bytes, bytearray)):
        return b"\xc6" + struct.pack(">I", len(o)) + bytes(o)
    if isinstance(o, (list, tuple)):
        return b"\xdd" + struct.pack(">I", len(o)) + b"".join(mp_pack(x) for x in o)
    if isinstance(o, dict):
        return b"\xdf" + struct.pack(">I", len(o)) + b"".join(
            mp_pack(k) + mp_pack(v) for k, v in o.items())
    raise TypeError(type(o))


def mp_unpack(b):
    """Decode one msgpack value; str must be valid UTF-8 (strict)."""
    def rd(i):
        t = b[i]
        i += 1
        if t <= 0x7F:
            return t, i
        if t >= 0xE0:
            return t - 256, i
        if 0x80 <= t <= 0x8F:
            return rmap(i, t & 15)
        if 0x90 <= t <= 0x9F:
            return rarr(i, t & 15)
        if 0xA0 <= t <= 0xBF:
            n = t & 31
            return b[i:i + n].decode("utf-8"), i + n
        if t == 0xC0:
            return None, i
        if t in (0xC2, 0xC3):
            return t == 0xC3, i
        fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: ">b", 0xD1: ">h",
                 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
        if t in fixed:
            f = fixed[t]
            n = struct.calcsize(f)
            return struct.unpack(f, b[i:i + n])[0], i + n
        lens = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xDC: 2, 0xDD: 4,
                0xDE: 2, 0xDF: 4}
        w = lens[t]
        n = int.from_bytes(b[i:i + w], "big")
        i += w
        if t in (0xC4, 0xC5, 0xC6):
            return bytes(b[i:i + n]), i + n
        if t in (0xD9, 0xDA, 0xDB):
            return b[i:i + n].decode("utf-8"), i + n
        if t in (0xDC, 0xDD):
            return rarr(i, n)
        return rmap(i, n)

    def rarr(i, n):
        out = []
        for _ in range(n):
            v, i = rd(i)
            out.append(v)
        return out, i

    def rmap(i, n):
        out = {}
        for _ in range(n):
            k, i = rd(i)
            v, i = rd(i)
            out[k] = v
        return out, i

    v, i = rd(0)
    assert i == len(b), "trailing bytes in a reply body"
    return v


def keys_body(keys, **extra):
    d = {"keys": {"model": keys.model, "kv_rank": keys.kv_rank, "group": keys.group,
                  "salt": keys.salt, "hashes": list(keys.hashes)}}
    d.update(extra)
    return mp_pack(d)


def raw_keys(model, hashes, **extra):
    d = {"keys": {"model": model, "hashes": hashes}}
    d.update(extra)
    return mp_pack(d)


# ------------------------------------------------------------ raw clients


class Reply:
    def __init__(self, frames):
        self.rid = frames[0]
        self.status = int.from_bytes(frames[1], "little", signed=True)
        self.raw_body = frames[2]
        self.body = mp_unpack(frames[2])
        self.data = frames[3:]

    def __repr__(self):
        return "Reply(%r, %d, %r, %d frames)" % (self.rid, self.status, self.body, len(self.data))


class RawZmq:
    def __init__(self, url, timeout_ms=15000, curve=None):
        """curve: (server public, client public, client secret), Z85 bytes."""
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve:
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, curve[2])
        self.sock.connect(url)

    def send(self, frames):
        self.sock.send_multipart(frames, copy=len(frames) < 64)

    def recv(self):
        return Reply(self.sock.recv_multipart())

    def call(self, frames):
        self.send(frames)
        return self.recv()

    def close(self):
        self.sock.close(0)
        self.ctx.term()


class RawLocal:
    """The same-host socket: u32 nframes, then per frame u32 length + bytes."""

    def __init__(self, name, timeout=15):
        assert name.startswith("@")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect("\0" + name[1:])

    def send(self, frames):
        parts = [struct.pack("<I", len(frames))]
        for f in frames:
            parts.append(struct.pack("<I", len(f)))
            parts.append(bytes(f))
        self.sock.sendall(b"".join(parts))

    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise ConnectionError("the server closed the connection")
            buf += got
        return bytes(buf)

    def recv(self):
        n = struct.unpack("<I", self._read(4))[0]
        frames = []
        for _ in range(n):
            ln = struct.unpack("<I", self._read(4))[0]
            frames.append(self._read(ln))
        return Reply(frames)

    def call(self, frames):
        self.send(frames)
        return self.recv()

    def close(self):
        self.sock.close()


def hello_body():
    return mp_pack({"version": 1})


def local_name(server):
    z = RawZmq(server.url)
    try:
        r = z.call([b"h", b"hello", hello_body()])
        assert r.status == 0, r
        return r.body["local"]
    finally:
        z.close()
