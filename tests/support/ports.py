"""Free TCP ports on loopback for test and benchmark servers.

free_port() cannot reserve a port (the server binds it later), but it never
hands out one of the last 256 it gave this process: the kernel can return
the same ephemeral port to two binds in a row once the first socket is
closed, and a server given one port for --port and --http-port fails to
start (seen in CI). Imported as one module (support.ports) by the
integration tests, the vLLM tests and the benchmarks, so that a process
keeps one record.

own_connections(port) counts this process's established connections to a
loopback port (a client's close is asynchronous; a test waits for it).

    python3 tests/support/ports.py [PORT...]   prints a free port not among PORTs
"""

import collections
import os
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


def own_connections(port):
    """This process's established TCP connections to 127.0.0.1:PORT."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    n = 0
    with open("/proc/self/net/tcp") as f:
        next(f)
        for line in f:
            x = line.split()
            rem_host, rem_port = x[2].split(":")
            if rem_host == "0100007F" and int(rem_port, 16) == port and x[3] == "01" \
                    and x[9] in mine:
                n += 1
    return n


if __name__ == "__main__":
    print(free_port({int(a) for a in sys.argv[1:]}))
