# kvtier: two commands do everything.
#   make run    installs what is missing, builds, starts kvtierd in the foreground
#               on an embedded default (a small demo namespace in /dev/shm, no GPU)
#   make test   installs what is missing, builds, runs every test (GPU tests skip
#               where there is no GPU)
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test test-gpu bench format clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/daemon/kvtierd --flagfile=deploy/dev.flags

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

bench: build
	$(BUILD)/bench/index_bench

format:
	@git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
