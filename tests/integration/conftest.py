"""Fixtures of the integration tests. The harness is tests/support
(docs/testing.md): every test starts the real kvtier binary on free ports
with its own temporary directory and talks to it with the real client
library.

    def test_x(server):                 # fs adapter under a temp dir
        c = server.client()
        ...
    def test_y(make_server, tmp_path):  # custom flags
        s = make_server(["--l2-adapter", json.dumps({...})])
"""

import pytest

from support.server import SANITIZER_MARKERS, Server


@pytest.fixture
def make_server(tmp_path):
    servers = []

    def make(args=(), data_dir=None, start=True, **kw):
        s = Server(args, tmp_path, data_dir=data_dir, **kw)
        servers.append(s)
        if start:
            s.start()
        return s

    yield make
    for s in servers:
        s.kill()
    # under the sanitizer builds (make test-asan / test-tsan) any report in a
    # server log fails the test, even if the server was killed afterwards
    for s in servers:
        log = s.read_log()
        for marker in SANITIZER_MARKERS:
            if marker in log:
                i = log.index(marker)
                pytest.fail("sanitizer report in %s:\n%s" % (s.log_path, log[max(0, i - 200):i + 4000]))


@pytest.fixture
def server(make_server, tmp_path):
    """A server with the embedded default: fs under tmp_path/data."""
    return make_server(data_dir=str(tmp_path / "data"))
