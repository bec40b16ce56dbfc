"""The `kvtier` console command of the wheel: runs the server binary bundled
with it (kvtier/_bin/kvtier), same command line and exit codes as the
installed binary. Replaces this process (exec), so signals, the exit status
and stdin/stdout/stderr are the binary's own.

A pure-Python install (KVTIER_PURE_PYTHON=1) has no bundled binary: the
command then runs the next `kvtier` binary on PATH (the Debian package's,
make install's), so that the venv's script does not hide it."""

import os
import sys


def binary():
    """The bundled server binary, or None where this install has none."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "kvtier")
    return path if os.access(path, os.X_OK) else None


def _system_binary():
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else None
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cand = os.path.join(d or ".", "kvtier")
        if not os.access(cand, os.X_OK) or os.path.realpath(cand) == me:
            continue
        try:
            with open(cand, "rb") as f:
                if f.read(4) == b"\x7fELF":  # not another venv's script
                    return cand
        except OSError:
            pass
    return None


def main():
    path = binary() or _system_binary()
    if path is None:
        sys.stderr.write("kvtier: no kvtier server binary: this kvtier Python package is a "
                         "pure-Python install and none is on PATH (install the kvtier wheel, "
                         "the Debian package, or `make install`)\n")
        return 1
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
