"""Free TCP ports on loopback for test and benchmark servers.

free_port() cannot reserve a port (the server binds it later), but it never
hands out one of the last 256 it gave this process: the kernel can return
the same ephemeral port to two binds in a row once the first socket is
closed, and a server given one port for --port and --http-port fails to
start (seen in CI). Imported as one module (support.ports) by the
integration tests, the vLLM tests and the benchmarks, so that a process
keeps one record.

    python3 tests/support/ports.py [PORT...]   prints a free port not among PORTs
"""

import collections
import socket
import sys

_given = collections.deque(maxlen=256)


def free_port(avoid=()):
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given and port not in avoid:
            _given.append(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


if __name__ == "__main__":
    print(free_port({int(a) for a in sys.argv[1:]}))
