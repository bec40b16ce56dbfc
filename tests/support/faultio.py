"""tests/faultio: an LD_PRELOAD library that fails, slows down or logs a
server's file I/O (see its header); not loadable into sanitized servers."""

import os

import pytest

from support.paths import LIB, SANITIZER

FAULTIO = os.path.join(os.path.dirname(LIB), "libkvt_faultio.so")


def needs_faultio(test):
    test = pytest.mark.skipif(not os.path.exists(FAULTIO), reason="libkvt_faultio.so not built")(test)
    return pytest.mark.skipif(bool(SANITIZER),
                              reason="an uninstrumented LD_PRELOAD library cannot load into a "
                              "sanitized server")(test)
