# The README's commands. Everything builds with CMake + Ninja into $(BUILD_DIR).
#
#   make demo    install deps, build, run the end-to-end demo
#   make test    install deps, build, run every test but the slow ones (what CI runs)
#   make test-slow  the tests labelled `slow` (long fault scenarios)
#   make build   configure and build only
#   make bench   build and run the benchmarks (never part of `make test`)
#   make package Debian packages with CPack, in $(BUILD_DIR)/packages (docs/install.md)
#   make install cmake --install into PREFIX (default /usr/local)
#   make gpu-bundle  the GPU checks as a tarball for a bare GPU node (docs/gpu.md)
#   make fuzz    libFuzzer harnesses, FUZZ_SECONDS (60) each, in build-fuzz (docs/fuzzing.md)
#   make format  clang-format every C++ file in place
#   make lint    clang-tidy over our sources
#
# Knobs: BUILD_DIR=build BUILD_TYPE=RelWithDebInfo SANITIZE=address,undefined
#        JOBS (build; default the core count) TEST_JOBS (ctest; JOBS + 1)
#        UNITY=ON UNITY_BATCH=16 (compile each target's files in batches of
#        up to 16; UNITY=OFF for quicker incremental rebuilds, docs/build.md)
#        CMAKE_ARGS="-DMESH_WITH_CUDA=OFF" CTEST_ARGS="-L unit"
#        BENCH=ON|OFF (build mesh-bench and its tests; `make test` sets OFF,
#        the other targets ON)
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
SANITIZE ?=
UNITY ?= ON
UNITY_BATCH ?= 16
CMAKE_ARGS ?=
CTEST_ARGS ?=
BENCH ?= ON
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Tests at once: one more than the cores, as most tests wait on processes
# and RPCs (2 cores: 282 s at -j3 against 327 s at -j2).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) + 1 )))

CXX_SOURCES = $(shell git ls-files '*.cc' '*.h' 2>/dev/null)

.PHONY: all deps configure build test test-slow demo bench package install gpu-bundle fuzz format lint clean

all: build

deps:
	scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DMESH_SANITIZE="$(SANITIZE)" \
	  -DCMAKE_UNITY_BUILD=$(UNITY) -DCMAKE_UNITY_BUILD_BATCH_SIZE=$(UNITY_BATCH) \
	  -DMESH_BENCH=$(BENCH) \
	  $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The benchmarks are not part of `make test` (docs/build.md): a target-
# specific value, so `configure` and `build` see it when `test` runs them.
test: BENCH = OFF
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(TEST_JOBS) -LE slow $(CTEST_ARGS)

test-slow: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(TEST_JOBS) -L slow $(CTEST_ARGS)

demo: build
	scripts/demo.sh $(BUILD_DIR)

bench: build
	scripts/bench.sh $(BUILD_DIR)

# Debian packages in $(BUILD_DIR)/packages (docs/install.md).
# lintian (scripts/install-deps.sh --packaging) then checks them.
package: build
	scripts/install-deps.sh --packaging
	cmake --build $(BUILD_DIR) --target package
	if command -v lintian >/dev/null; then lintian --fail-on error $(BUILD_DIR)/packages/*.deb; fi

# Installs into PREFIX (default /usr/local; docs/install.md).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

gpu-bundle: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target gpu-bundle

# Not part of `make test`: clang, its own build dir, FUZZ_SECONDS per target.
fuzz: deps
	scripts/fuzz.sh

format:
	clang-format -i $(CXX_SOURCES)

lint: configure
	clang-tidy -p $(BUILD_DIR) --quiet $(filter %.cc,$(CXX_SOURCES))

clean:
	rm -rf $(BUILD_DIR)
