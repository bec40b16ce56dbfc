"""The build tree's install rules, for the tests of what installs
(test_install.py, test_package.py, test_pip.py, test_service.py): where the
build is, a skip mark for a run without a CMake build tree, a C program
that round-trips one object through the installed client library, and a
Server started from an installed binary."""

import os
import textwrap

import pytest

from support.paths import BIN, SANITIZER
from support.server import Server

BUILD = os.path.dirname(os.path.abspath(BIN))
HAVE_INSTALL = os.path.exists(os.path.join(BUILD, "cmake_install.cmake"))
# these tests load or link the build's own client library, which a sanitizer
# build instruments (it cannot load into an uninstrumented process)
needs_build_tree = pytest.mark.skipif(
    not HAVE_INSTALL or bool(SANITIZER),
    reason="KVTIER_BIN is not in a CMake build tree, or it is a sanitizer build")


# store, lookup and retrieve one object through the C API; argv[1] = url
ROUND_TRIP_C = textwrap.dedent(r"""
        #include <kvtier/client.h>
        #include <stdio.h>
        #include <string.h>
        int main(int argc, char **argv)
        {
            (void)argc;
            kvt_client_opts o = {.no_shm = true, .no_local = true};
            kvt_client *c = NULL;
            if (kvt_client_open(argv[1], &o, &c)) {
                fprintf(stderr, "open: %s\n", kvt_client_open_error());
                return 1;
            }
            uint8_t h[32];
            memset(h, 7, sizeof(h));
            kvt_keys k = {.model = "pc-test", .hashes = h, .hash_len = 32, .n = 1};
            const char payload[] = "hello from the C API";
            const void *bufs[1] = {payload};
            size_t lens[1] = {sizeof(payload)}, acc = 0, hits = 0, n = 0;
            kvt_blob *b = NULL;
            int rc = kvt_store(c, &k, bufs, lens, NULL, &acc);
            if (!rc)
                rc = kvt_lookup(c, &k, &hits);
            if (!rc)
                rc = kvt_retrieve(c, &k, &b, &n);
            if (rc || acc != 1 || hits != 1 || n != 1) {
                fprintf(stderr, "rc %d (%s) acc %zu hits %zu n %zu\n", rc, kvt_strerror(rc), acc,
                        hits, n);
                return 1;
            }
            printf("%.*s\n", (int)b[0].len, (const char *)b[0].data);
            kvt_blobs_free(b, n);
            kvt_client_close(c);
            return 0;
        }
    """)


class InstalledServer(Server):
    """A Server started from another binary (an installed one)."""

    def __init__(self, binpath, *a, **kw):
        super().__init__(*a, **kw)
        self.binpath = binpath

    def cmd(self):
        c = super().cmd()
        c[0] = self.binpath
        return c
