# kvtier: `make run` (set up, build, start the server on ./kvtier-data),
# `make test` (set up, build, run every test). CMake does the building.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTEST ?= /usr/bin/python3 -m pytest

.PHONY: all deps configure build run test unit integration clean format check-format bench \
	test-asan test-tsan test-sanitize

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

configure: deps $(BUILD)/Makefile

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/kvtier server $(ARGS)

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit -j $(JOBS)

integration: build
	KVTIER_BIN=$(abspath $(BUILD))/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(PYTEST) -q tests/integration $(PYTEST_ARGS)

# Under CI (CI=true) the suite also runs once more with AddressSanitizer +
# UndefinedBehaviorSanitizer and once with ThreadSanitizer.
test: unit integration
ifeq ($(CI),true)
test: test-sanitize
endif

test-sanitize: test-asan test-tsan

build-asan/Makefile: CMakeLists.txt
	cmake -S . -B build-asan -DKVT_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug >/dev/null

build-tsan/Makefile: CMakeLists.txt
	cmake -S . -B build-tsan -DKVT_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug >/dev/null

# The Python tests load the normal client library (an instrumented one cannot
# be loaded into an uninstrumented interpreter); the server is instrumented.
test-asan: build deps build-asan/Makefile
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -L unit -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	KVTIER_SANITIZER=address KVTIER_BIN=$(abspath build-asan)/kvtier KVTIER_LIB=$(abspath $(BUILD))/libkvtier_client.so \
	  $(PYTEST) -q tests/integration $(PYTEST_ARGS)

test-tsan: build deps build-tsan/Makefile
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

check-format:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) build-asan build-tsan
