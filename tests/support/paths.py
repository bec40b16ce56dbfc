"""Where the tree and the binaries under test are.

KVTIER_BIN names the kvtier binary (default build/kvtier); KVTIER_LIB the
client library that the kvtier module loads (default
build/libkvtier_client.so, set here so that every `import kvtier` after
this one loads the library of the build under test); KVTIER_SANITIZER the
sanitizer that binary was built with ("address", "thread"; "" for none:
make test-asan and test-tsan set it)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVTIER_BIN", os.path.join(ROOT, "build", "kvtier"))
os.environ.setdefault("KVTIER_LIB", os.path.join(ROOT, "build", "libkvtier_client.so"))
LIB = os.environ["KVTIER_LIB"]
SANITIZER = os.environ.get("KVTIER_SANITIZER", "")
