"""A TCP proxy of the tests' own in front of an HTTP/1.1 server (an S3
server), switched at run time between faults. Standard library only: one
thread accepts, one thread per client connection relays request by request
(HTTP/1.1 keep-alive, no pipelining: libcurl sends the next request on a
connection only after the previous answer).

Modes (set_mode), each applying to new and existing connections:

  pass    relay every request to the upstream and its answer back
  hang    accept and hold: nothing is read or forwarded in either direction,
          also in the middle of a request or an answer; when the mode
          changes back the held bytes flow on
  500     answer every request with 500 InternalError and an S3 XML error
          body, keep-alive (the request body is read and dropped); with
          delay=s the answer comes s seconds after the request
  reset   RST every connection (existing ones within about 50 ms, new ones
          right after accept)
  refuse  stop listening (connects are refused) and RST existing connections
  slow    relay as pass, but send to the client at most rate bytes a second
          (a slow download link: answers arrive, byte by byte, for longer
          than any request timeout)

hang_if(method, path) -> bool, when given, hangs only the requests it picks
while the mode is pass (a server stuck on one kind of request).

    px = FaultProxy(upstream_port)
    px.set_mode("hang"); ...; px.set_mode("pass")
    px.close()
"""

import collections
import select
import socket
import struct
import threading
import time

ERROR_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
              b'<Message>We encountered an internal error. Please try again.</Message>'
              b'<RequestId>faultproxy</RequestId></Error>')
TICK = 0.05  # how often a blocked relay looks at the mode again
MODES = ("pass", "hang", "500", "reset", "refuse", "slow")


class _Closed(Exception):
    """The connection was reset or closed by the proxy or a peer."""


class FaultProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1", hang_if=None):
        self.up = (upstream_host, upstream_port)
        self.mode = "pass"
        self.delay = 0.0
        self.rate = 0
        self.hang_if = hang_if
        self.stats = collections.Counter()
        self.cv = threading.Condition()
        self.closed = False
        self.threads = []
        self.lsock = None
        self._listen(0)
        self.port = self.lsock.getsockname()[1]
        self.acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self.acceptor.start()

    # ------------------------------------------------------------ control

    def set_mode(self, mode, delay=0.0, rate=0):
        assert mode in MODES, mode
        with self.cv:
            was = self.mode
            self.mode, self.delay, self.rate = mode, delay, rate
            self.stats["mode_" + mode] += 1
            if mode == "refuse" and self.lsock is not None:
                self.lsock.close()
                self.lsock = None
            elif mode != "refuse" and was == "refuse":
                self._listen(self.port)
            self.cv.notify_all()

    def close(self):
        with self.cv:
            self.closed = True
            if self.lsock is not None:
                self.lsock.close()
                self.lsock = None
            self.cv.notify_all()
        self.acceptor.join(timeout=5)
        for t in list(self.threads):
            t.join(timeout=5)

    # ----------------------------------------------------------- plumbing

    def _listen(self, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        self.lsock = s

    def _accept_loop(self):
        while True:
            with self.cv:
                if self.closed:
                    return
                ls = self.lsock
                if ls is None:  # refusing: wait for the mode to change
                    self.cv.wait(TICK)
                    continue
            try:
                r, _, _ = select.select([ls], [], [], TICK)
                if not r:
                    continue
                c, _ = ls.accept()
            except (OSError, ValueError):  # closed under us by set_mode
                continue
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.stats["accepted"] += 1
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
            t.start()

    def set_hang_if(self, hang_if):
        """Hang the requests hang_if(method, path) picks while in pass mode
        (None: none); held requests go on once it is cleared."""
        with self.cv:
            self.hang_if = hang_if
            self.cv.notify_all()

    def _gate(self, held=False):
        """The mode once the relay may go on: blocks while hanging (held:
        the current request is one hang_if picked); raises _Closed to
        reset."""
        with self.cv:
            while True:
                if self.closed or self.mode in ("reset", "refuse"):
                    raise _Closed()
                hanging = self.mode == "hang" or (held and self.hang_if is not None and
                                                  self.mode == "pass")
                if not hanging:
                    return self.mode
                self.cv.wait(TICK)

    def _recv(self, s, held=False):
        while True:
            self._gate(held)
            r, _, _ = select.select([s], [], [], TICK)
            if r:
                try:
                    return s.recv(1 << 16)
                except OSError:
                    raise _Closed()

    def _send(self, s, data, held=False, to_client=False):
        view = memoryview(data)
        while view:
            mode = self._gate(held)
            chunk = 1 << 16
            if mode == "slow" and to_client:  # rate bytes a second, a tick's worth at a time
                chunk = max(1, int(self.rate * TICK))
                time.sleep(TICK)
            _, w, _ = select.select([], [s], [], TICK)
            if w:
                try:
                    n = s.send(view[:chunk])
                except OSError:
                    raise _Closed()
                view = view[n:]

    @staticmethod
    def _rst(s):
        if s is None:
            return
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        s.close()

    # ------------------------------------------------------------- HTTP

    def _read_head(self, s, buf, held=False):
        """Read up to the end of a header block: (head, rest), or (None, b"")
        at a clean EOF before any byte."""
        while b"\r\n\r\n" not in buf:
            d = self._recv(s, held)
            if not d:
                if buf:
                    raise _Closed()
                return None, b""
            buf += d
        i = buf.index(b"\r\n\r\n") + 4
        return buf[:i], buf[i:]

    @staticmethod
    def _headers(head):
        lines = head.decode("latin-1").split("\r\n")
        h = {}
        for ln in lines[1:]:
            k, sep, v = ln.partition(":")
            if sep:
                h[k.strip().lower()] = v.strip()
        return lines[0], h

    def _read_exact(self, s, buf, n, held=False):
        while len(buf) < n:
            d = self._recv(s, held)
            if not d:
                raise _Closed()
            buf += d
        return buf[:n], buf[n:]

    def _relay_body(self, up, c, buf, n, held):
        """Relay n body bytes from up to c (buf: bytes already read)."""
        while n > 0:
            if not buf:
                buf = self._recv(up, held)
                if not buf:
                    raise _Closed()
            part, buf = buf[:n], buf[n:]
            self._send(c, part, held, to_client=True)
            n -= len(part)
        return buf

    def _relay_chunked(self, up, c, buf, held):
        while True:
            while b"\r\n" not in buf:
                d = self._recv(up, held)
                if not d:
                    raise _Closed()
                buf += d
            i = buf.index(b"\r\n") + 2
            size = int(buf[:i].split(b";")[0], 16)
            self._send(c, buf[:i], held, to_client=True)
            buf = buf[i:]
            if size == 0:  # trailers up to an empty line
                while True:
                    while b"\r\n" not in buf:
                        d = self._recv(up, held)
                        if not d:
                            raise _Closed()
                        buf += d
                    i = buf.index(b"\r\n") + 2
                    line, buf = buf[:i], buf[i:]
                    self._send(c, line, held, to_client=True)
                    if line == b"\r\n":
                        return buf
            buf = self._relay_body(up, c, buf, size + 2, held)

    def _answer_500(self, c, method):
        with self.cv:
            delay = self.delay
        end = time.time() + delay
        while time.time() < end:
            self._gate()
            time.sleep(min(TICK, max(0.0, end - time.time())))
        head = ("HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n"
                "Content-Length: %d\r\nx-amz-request-id: faultproxy\r\n"
                "Connection: keep-alive\r\n\r\n" % len(ERROR_BODY)).encode()
        self._send(c, head + (b"" if method == "HEAD" else ERROR_BODY))
        self.stats["answered_500"] += 1

    def _forward(self, c, up, method, path, request, held):
        """Send one request upstream and relay its answer; returns the
        upstream connection to keep (None when it must not be reused)."""
        for _ in range(2):
            reused = up is not None
            if up is None:
                up = socket.create_connection(self.up, timeout=10)
                up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self._send(up, request, held)
                head, rest = self._read_head(up, b"", held)
            except _Closed:
                head = None
            if head is not None:
                break
            self._rst(up)  # an idle keep-alive connection the upstream closed: once more
            up = None
            if not reused:
                raise _Closed()
        self._send(c, head, held, to_client=True)
        status, h = self._headers(head)
        code = int(status.split()[1])
        if method == "HEAD" or code in (204, 304) or 100 <= code < 200:
            pass  # no body
        elif "chunked" in h.get("transfer-encoding", "").lower():
            rest = self._relay_chunked(up, c, rest, held)
        elif "content-length" in h:
            rest = self._relay_body(up, c, rest, int(h["content-length"]), held)
        else:  # the body ends with the connection
            while True:
                if rest:
                    self._send(c, rest, held, to_client=True)
                rest = self._recv(up, held)
                if not rest:
                    raise _Closed()
        self.stats["forwarded"] += 1
        if rest or h.get("connection", "").lower() == "close":
            self._rst(up)
            return None
        return up

    def _serve(self, c):
        up = None
        buf = b""
        try:
            while True:
                head, buf = self._read_head(c, buf)
                if head is None:
                    return
                line, h = self._headers(head)
                method, path = line.split()[0], line.split()[1]
                body, buf = self._read_exact(c, buf, int(h.get("content-length") or 0))
                self.stats["requests"] += 1
                held = bool(self.hang_if and self.hang_if(method, path))
                if held:
                    self.stats["held"] += 1
                mode = self._gate(held)
                if mode == "500":
                    self._answer_500(c, method)
                    continue
                up = self._forward(c, up, method, path, head + body, held)
        except _Closed:
            self.stats["resets"] += 1
            self._rst(c)
            c = None
        except OSError:
            self.stats["upstream_errors"] += 1
            self._rst(c)
            c = None
        finally:
            self._rst(up)
            if c is not None:
                c.close()
