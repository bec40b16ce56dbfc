"""The `kvtier` console command of the wheel: runs the server binary bundled
with it (kvtier/_bin/kvtier), same command line and exit codes as the
installed binary. Replaces this process (exec), so signals, the exit status
and stdin/stdout/stderr are the binary's own."""

import os
import sys


def binary():
    """The bundled server binary, or None where this install has none (a
    pure-Python install: then use the system's kvtier)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "kvtier")
    return path if os.access(path, os.X_OK) else None


def main():
    path = binary()
    if path is None:
        sys.stderr.write("kvtier: this kvtier Python package has no server binary (a pure-Python "
                         "install): install the wheel, the Debian package or `make install`\n")
        return 1
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
