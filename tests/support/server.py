"""One kvtier server process on free ports with its own directory, and the
helpers every test of a running server uses: waiting for a condition,
running the binary, a server's L2 status, SIGKILLs under load."""

import os
import signal
import subprocess
import tempfile
import time

import kvtier
from support.paths import BIN, SANITIZER
from support.ports import free_port

# A sanitized server runs several times slower (TSan about 5-15x on the
# 2-core CI machine): latency bounds of responsiveness tests scale by this.
SLOW = 4 if SANITIZER else 1

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:")


# what a server logs when it exited because a port was taken
PORT_IN_USE = ("Address already in use",)


def start_on_free_port(obj, launch, new_ports, attempts=5):
    """Start a server process on ports from free_port(), which cannot reserve
    them: between it and the server's bind another process (a client's
    ephemeral port, another test server) may take one. launch() starts once:
    True when ready, False when it exited for a port in use (or, on a
    restart, a resource its killed predecessor still held); it raises on any
    other failure. A first start moves to fresh ports (new_ports()); a
    restart keeps them (clients and adapters hold them) and tries again."""
    for attempt in range(attempts):
        if launch():
            obj.started = True
            return obj
        if getattr(obj, "started", False):
            time.sleep(0.5)
        else:
            new_ports()
    raise RuntimeError("%s did not start in %d attempts (ports in use)" % (type(obj).__name__, attempts))


class Server:
    """One kvtier server process."""

    def __init__(self, args, workdir, data_dir=None, http=True, env=None):
        self.args = list(args)
        self.workdir = str(workdir)
        self.data_dir = data_dir
        self.port = free_port()
        self.http_port = free_port() if http else 0
        self.url = "tcp://127.0.0.1:%d" % self.port
        self.env = env
        self.proc = None
        self.log_path = os.path.join(self.workdir, "server-%d.log" % self.port)

    def cmd(self):
        c = [BIN, "server", "--port", str(self.port), "--http-port", str(self.http_port),
             "--l1-size-gb", "0.25", "--l1-init-size-gb", "0.25"]
        if self.data_dir is not None:
            c += ["--data-dir", self.data_dir]
        return c + self.args

    def start(self, wait=True):
        def launch():
            self.log = open(self.log_path, "ab")
            self.log_start = self.log.tell()
            env = dict(os.environ)
            if self.env:
                env.update(self.env)
            self.proc = subprocess.Popen(self.cmd(), stdout=self.log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=env)
            if not wait:
                return True
            try:
                self.wait_ready()
                return True
            except RuntimeError:
                log = self.read_log()[self.log_start:]
                self.log.close()
                # a restart right after a SIGKILL can meet the dead server's
                # device lock still held by its io_uring teardown
                if self.proc.poll() is not None and (any(m in log for m in PORT_IN_USE) or (
                        getattr(self, "started", False) and "in use by another process" in log)):
                    return False
                raise
        return start_on_free_port(self, launch, self.new_ports)

    def new_ports(self):
        self.port = free_port()
        self.http_port = free_port() if self.http_port else 0
        self.url = "tcp://127.0.0.1:%d" % self.port

    def wait_ready(self, timeout=20):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %s:\n%s" % (self.proc.returncode, self.read_log()))
            try:
                c = kvtier.Client(self.url, timeout_ms=500)
                c.ping()
                c.close()
                return
            except kvtier.KvtierError as e:
                last = e
                time.sleep(0.05)
        raise RuntimeError("server not ready: %s\n%s" % (last, self.read_log()))

    def wait_recovered(self, timeout=30):
        """Wait until every adapter's start-up scan is done."""
        deadline = time.time() + timeout
        with self.client() as c:
            while time.time() < deadline:
                st = c.status()
                if all(a["recovery"]["state"] == "done" for a in st["l2"]):
                    return st
                time.sleep(0.05)
        raise RuntimeError("recovery did not finish")

    def client(self, **kw):
        return kvtier.Client(self.url, **kw)

    def read_log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)
        return self.proc.returncode if self.proc else None

    def stop(self):
        return self.kill(signal.SIGTERM)

    def restart(self):
        self.kill()
        return self.start()

    def http_get(self, path):
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.http_port, path), timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def wait_for(pred, timeout=20, what="condition"):
    """Poll pred every 50 ms until it returns something true (returned)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Kills:
    """SIGKILLs under a client load. A load thread reads `done` before each
    request: an error is the kill's only if a kill began since and it is a
    connection or timeout error; anything else (E_FULL, E_CORRUPT, ...) is a
    real failure. A store is acknowledged only if no kill began between its
    send and its flush's reply. The server's same-host socket reports a kill
    at once and the client says hello again over a fresh ZeroMQ connection,
    so start the server again before joining the load thread: its request
    ends on the new server. Only a request that went out over ZeroMQ just
    before the kill (the client's first hello) is lost with the connection
    and ends at timeout_ms, excused only then."""

    # a killed server's replies never come, its connection drops, and what
    # the client held of it (shared-memory leases) is unknown to the next one
    EXCUSED = ("E_TIMEOUT", "E_PROTO", "E_CLOSED", "E_EXPIRED")
    timeout_ms = 10000

    def __init__(self):
        self.begun = self.done = 0
        self.timeouts = 0

    def kill(self, server):
        self.begun += 1
        server.kill(signal.SIGKILL)
        self.done += 1

    def excused(self, since, e):
        if self.begun == since or not (e.name in self.EXCUSED or -1000 < e.code < 0):
            return False
        self.timeouts += e.name == "E_TIMEOUT"
        return True


def metric(server, name, **labels):
    """The value of the first sample of metric name whose labels include
    labels, from the server's /metrics; None when there is none."""
    code, text = server.http_get("/metrics")
    assert code == 200
    for line in text.splitlines():
        if line.startswith(name + "{") and all('%s="%s"' % kv in line for kv in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def l2_status(server, i=0):
    """The status object of L2 adapter i of a running server."""
    with server.client() as c:
        return c.status()["l2"][i]


def run_kvtier(*args, timeout=60, **kw):
    """Run the kvtier binary; returns CompletedProcess with text output."""
    return subprocess.run([BIN] + list(args), capture_output=True, text=True, timeout=timeout, **kw)


def real_start(spec, cwd):
    """Start a server; stop it (SIGTERM) once it listens. Returns (started,
    exit code, log)."""
    for _ in range(5):
        cmd = [BIN, "server", "--port", str(free_port()), "--http-port", "0", "--l1-size-gb",
               "0.1", "--l1-init-size-gb", "0.1", "--l2-adapter", spec]
        with tempfile.TemporaryFile() as out:  # outside cwd: cwd is compared
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
            deadline = time.time() + 30

            def log():
                out.seek(0)
                return out.read().decode(errors="replace")
            while time.time() < deadline and p.poll() is None and "listening on" not in log():
                time.sleep(0.05)
            started = p.poll() is None
            if started:
                p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
            text = log()
        if "Address already in use" not in text:
            return started, p.returncode, text
    raise RuntimeError("no free port")
