# The two commands:
#   make run    one seeded problem through a kernel and the reference, with the report
#   make test   build everything and run the test suite (GPU tests skip without a GPU)
# PRESET=debug builds with device debug info (-G) instead.
PRESET ?= release
BUILD := build/$(PRESET)
RUN_ARGS ?= --kernel auto --batch 2 --heads 16 --kv-heads 4 --seqlen-q 1023 --seqlen-k 1023 \
            --head-dim 64 --dtype fp16 --causal --seed 1
SHELL := /bin/bash
ENV := source scripts/env.sh &&

.PHONY: setup configure build run test bench clean
setup:
	@scripts/setup.sh

configure: setup
	@$(ENV) cmake --preset $(PRESET) >/dev/null

build: configure
	@$(ENV) cmake --build --preset $(PRESET)

run: build
	@$(BUILD)/flashlab-run $(RUN_ARGS)

test: build
	@$(ENV) ctest --preset $(PRESET) -j $$(nproc) --timeout 1200

bench: build
	@$(BUILD)/flashlab-bench $(BENCH_ARGS)

clean:
	rm -rf build
