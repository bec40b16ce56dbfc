"""Redis processes for the integration tests and benchmarks: one
redis-server on a free loopback port (Redis), and a Redis Cluster of
cluster-enabled servers (Node, Cluster: 3 masters + 3 replicas by
default) with the cluster created by redis-cli; resp_json(), the resp
adapter's spec for one of them."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time

from support.ports import free_port
from support.server import start_on_free_port, wait_for

REDIS = shutil.which("redis-server")
CLI = shutil.which("redis-cli")


def resp_json(redis, **kw):
    """The resp adapter's --l2-adapter JSON for a Redis server (prefix "t")."""
    spec = dict(type="resp", host="127.0.0.1", port=redis.port, key_prefix="t")
    spec.update(kw)
    return json.dumps(spec)


class Redis:
    """A redis-server process on a free port (no persistence unless asked)."""

    def __init__(self, workdir, password=None, persist=False):
        self.dir = str(workdir)
        self.port = free_port()
        self.password = password
        self.persist = persist
        self.proc = None

    def start(self):
        args = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--save", "" if not self.persist else "1 1", "--appendonly", "no",
                "--protected-mode", "no", "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        def launch():
            args[2] = str(self.port)
            self.log = open(os.path.join(self.dir, "redis-%d.log" % self.port), "ab")
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
            deadline = time.time() + 10
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    if self.cmd("PING") in (b"PONG", "NOAUTH"):
                        return True
                except OSError:
                    time.sleep(0.02)
            self.log.close()
            if self.proc.poll() is None:
                raise RuntimeError("redis-server did not answer")
            return False  # exited: most likely its port was taken

        def new_port():
            self.port = free_port()
        return start_on_free_port(self, launch, new_port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def cmd(self, *args):
        """One command over a fresh connection (tiny RESP client)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            f = s.makefile("rb")
            if self.password:
                s.sendall(self._enc(["AUTH", self.password]))
                self._read(f)
            s.sendall(self._enc(args))
            return self._read(f)

    @staticmethod
    def _enc(args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        return out

    def _read(self, f):
        line = f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest
        if t == b"-":
            return "NOAUTH" if rest.startswith(b"NOAUTH") else RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)
            return data[:-2]
        if t == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise RuntimeError("bad reply %r" % line)

    def info(self, section="stats"):
        text = self.cmd("INFO", section).decode()
        out = {}
        for ln in text.splitlines():
            if ":" in ln and not ln.startswith("#"):
                k, v = ln.split(":", 1)
                out[k] = v
        return out

    def keys(self, pattern="*"):
        return sorted(k.decode() for k in self.cmd("KEYS", pattern))


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def cluster_ports(n):
    """n ports whose cluster bus ports (+10000) are free too, both below the
    kernel's ephemeral range: a node killed and started again must find its
    port free, and an outgoing connection may be given any ephemeral port
    meanwhile (seen: "bind: Address already in use" on a restart)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    r = random.Random(os.getpid() ^ int(time.time()))
    out = []
    while len(out) < n:
        p = r.randrange(10000, max(10001, low - 10000))
        if p not in out and _bindable(p) and _bindable(p + 10000):
            out.append(p)
    return out


class Node(Redis):
    """One cluster-enabled redis-server (extra: more server arguments)."""

    def __init__(self, workdir, port, extra=()):
        super().__init__(workdir)
        self.port = port
        self.extra = list(extra)

    def start(self):
        args = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000",
                "--cluster-replica-validity-factor", "0", "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--loglevel", "warning"] + self.extra
        self.log = open(os.path.join(self.dir, "redis.log"), "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server on %d exited" % self.port)
            try:
                if self.cmd("PING") == b"PONG":
                    return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server on %d did not answer" % self.port)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def cluster_info(self):
        out = {}
        r = self.cmd("CLUSTER", "INFO")
        if isinstance(r, Exception):  # e.g. LOADING after a restart
            raise r
        for ln in r.decode().splitlines():
            if ":" in ln:
                k, v = ln.split(":", 1)
                out[k] = v.strip()
        return out

    def is_master(self):
        r = self.cmd("ROLE")
        if isinstance(r, Exception):
            raise r
        return r[0] == b"master"

    def myid(self):
        return self.cmd("CLUSTER", "MYID").decode()


class Cluster:
    def __init__(self, root, extra=()):
        self.replicas_synced = True  # until a master is killed for good
        self.nodes = []
        for p in cluster_ports(6):
            d = root / ("n%d" % p)
            d.mkdir()
            self.nodes.append(Node(d, p, extra))

    def start(self):
        for n in self.nodes:
            n.start()
        r = subprocess.run([CLI, "--cluster", "create"] +
                           ["127.0.0.1:%d" % n.port for n in self.nodes] +
                           ["--cluster-replicas", "1", "--cluster-yes"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        self.wait_ok(timeout=60)
        return self

    def wait_ok(self, timeout=30):
        def ok():
            try:
                for n in self.nodes:
                    if not n.alive():
                        continue
                    ci = n.cluster_info()
                    if ci.get("cluster_state") != "ok" or ci.get("cluster_slots_ok") != "16384":
                        return False
                    if self.replicas_synced and not n.is_master() and \
                            n.info("replication").get("master_link_status") != "up":
                        return False
                return len(self.masters()) == 3
            except (OSError, RuntimeError, IndexError):
                return False
        try:
            wait_for(ok, timeout=timeout, what="cluster_state:ok on every node")
        except AssertionError:
            for n in self.nodes:
                if n.alive():
                    print(n.port, n.cluster_info(), n.cmd("ROLE"))
                    print(n.cmd("CLUSTER", "NODES").decode())
            raise

    def masters(self):
        return [n for n in self.nodes if n.alive() and n.is_master()]

    def stop(self):
        for n in self.nodes:
            n.kill()

    def seed(self):
        return next(n for n in self.nodes if n.alive())


def start_cluster(root_factory, extra=()):
    """A started Cluster under a fresh directory of root_factory (pytest's
    tmp_path_factory), its nodes started with extra arguments. A port found
    free can be taken by another process before redis-server binds it
    (other test runs on the machine): start again on new ports, at most
    three times, saying why."""
    for attempt in range(3):
        c = Cluster(root_factory.mktemp("cluster"), extra=extra)
        try:
            return c.start()
        except (RuntimeError, AssertionError, OSError) as e:
            c.stop()
            if attempt == 2:
                raise
            print("cluster start failed (%s): again on new ports" % e)
