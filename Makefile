# kvtier: `make run` (set up, build, start the server on ./kvtier-data),
# `make test` (set up, build, run every test). CMake does the building.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
PYTEST ?= /usr/bin/python3 -m pytest

.PHONY: all deps configure build run test unit integration clean format check-format bench

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

test: unit integration

bench: build
	./bench/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

check-format:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD)
