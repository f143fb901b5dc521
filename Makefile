# g4 build. `make` builds build/release/g4; `make test` runs every test; `make asan-test` runs
# them again under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan).
#
# -ffp-contract=off: no fused multiply-add contraction anywhere. A 1-ulp difference before an
# int8 rounding can flip a code and fork the generated tokens, so every build and dispatch level
# must evaluate float expressions exactly as written. Never add -ffast-math.

CC      ?= cc
CFLAGS_COMMON = -std=c11 -Wall -Wextra -Werror -ffp-contract=off -pthread -Iinclude -Isrc -MMD -MP
LDLIBS  = -lcjson -lpcre2-8 -lm -pthread

BUILD ?= release
ifeq ($(BUILD),asan)
  OPT = -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDFLAGS_MODE = -fsanitize=address,undefined
else
  OPT = -O2 -g
  LDFLAGS_MODE =
endif
OUT = build/$(BUILD)

include sources.mk

TESTS = test_config test_int8 test_unit_linear test_litert test_kernels test_tanh_monotone test_tokenizer test_chat test_gsm8k test_sampler test_generate test_fixture test_switches test_synth test_broken_checkpoint test_cli test_text_cli test_eval

LIB_OBJ = $(LIB_SRC:%.c=$(OUT)/%.o)
TEST_BIN = $(TESTS:%=$(OUT)/tests/%)

.PHONY: all test asan-test dispatch-test neon-test quality check clean fuzz fuzz-run
.SECONDARY: $(OUT)/bench/bench_kernels.o $(TESTS:%=$(OUT)/tests/%.o) $(OUT)/tests/test_quality.o $(OUT)/tools/g4.o $(OUT)/tools/cli.o $(OUT)/tools/text_cmds.o $(OUT)/tools/bench_cmd.o $(OUT)/tools/eval_cmd.o $(OUT)/tools/synth_cmd.o
all: $(OUT)/g4

$(OUT)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(CC) $(CFLAGS_COMMON) $(OPT) $(CFLAGS) -c $< -o $@

# Register-pressure-aware scheduling before allocation keeps the int8 tiles' int16 sums in
# registers (without it GCC 12 spills one per block in the 2-bit prefill loop); it only reorders
# instructions, so results are unchanged.
$(OUT)/src/kernels/avx2.o: CFLAGS += -fschedule-insns -fsched-pressure

# the CLI finds the built-in model (models/) of the tree it was built from
$(OUT)/tools/cli.o: CFLAGS += -DG4_SOURCE_DIR='"$(CURDIR)"' 

$(OUT)/libg4.a: $(LIB_OBJ)
	@ar rcs $@ $^

$(OUT)/g4: $(OUT)/tools/g4.o $(OUT)/tools/cli.o $(OUT)/tools/text_cmds.o $(OUT)/tools/bench_cmd.o $(OUT)/tools/eval_cmd.o $(OUT)/tools/synth_cmd.o $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(OUT)/tests/%: $(OUT)/tests/%.o $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The kernel micro-benchmark (bench/bench_kernels.c): built with the tests so it keeps compiling,
# run by hand (`build/release/bench_kernels [quick]`).
$(OUT)/bench_kernels: $(OUT)/bench/bench_kernels.o $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Runs every test program; each prints "name: N passed, N failed, N skipped", judged by
# tests/result.sh (no closing line, a bad exit or no passed check fails the program). G4_BIN lets
# tests run the CLI. The shared fixtures are reference data: a program that leaves a new entry
# under them, or changes one, fails (listing and timestamps compared around each program).
SHARED_DIR = $(or $(G4_SHARED),../shared)
test: $(OUT)/g4 $(TEST_BIN) $(OUT)/bench_kernels
	@total_p=0; total_f=0; total_s=0; \
	for t in $(TEST_BIN); do \
	  find $(SHARED_DIR) 2>/dev/null | LC_ALL=C sort > $$t.shared; \
	  G4_BIN=$(OUT)/g4 $$t > $$t.log 2>&1; rc=$$?; grep -v '^ok ' $$t.log; \
	  set -- $$(sh tests/result.sh $$t $$t.log $$rc); p=$$1; f=$$2; s=$$3; \
	  wrote=$$({ find $(SHARED_DIR) 2>/dev/null | LC_ALL=C sort | comm -13 $$t.shared -; \
	            find $(SHARED_DIR) -newer $$t.shared 2>/dev/null; } | LC_ALL=C sort -u); \
	  if [ -n "$$wrote" ]; then echo "$$t wrote under $(SHARED_DIR):" $$wrote; f=$$((f + 1)); fi; \
	  total_p=$$((total_p + p)); total_f=$$((total_f + f)); total_s=$$((total_s + s)); \
	done; \
	echo "$(BUILD): $$total_p passed, $$total_f failed, $$total_s skipped"; [ $$total_f -eq 0 ]

asan-test:
	$(MAKE) BUILD=asan test

# The model-level tests again under each kernel level forced with G4_DISPATCH: every level must
# give the same tokens (and, by construction, the same bits) on the fixtures. `make test` runs the
# best level the CPU has; this runs the others too. A level the CPU lacks is skipped by each
# program with a printed reason (tests/testutil.h, check_dispatch_level). NEON runs under qemu
# (neon-test).
DISPATCH_TESTS = test_fixture test_generate test_switches test_unit_linear
DISPATCH_LEVELS = portable avx2 avxvnni avx512vnni
dispatch-test: $(DISPATCH_TESTS:%=$(OUT)/tests/%)
	@all_f=0; \
	for level in $(DISPATCH_LEVELS); do \
	  total_p=0; total_f=0; total_s=0; \
	  for t in $^; do \
	    G4_DISPATCH=$$level $$t > $$t.$$level.log 2>&1; rc=$$?; \
	    set -- $$(sh tests/result.sh $$t $$t.$$level.log $$rc); \
	    [ $$2 -eq 0 ] || { grep -v '^ok ' $$t.$$level.log | tail -5; echo "$$t failed with G4_DISPATCH=$$level"; }; \
	    grep '^skip ' $$t.$$level.log | sed "s|^|  $$(basename $$t): |"; \
	    total_p=$$((total_p + $$1)); total_f=$$((total_f + $$2)); total_s=$$((total_s + $$3)); \
	  done; \
	  echo "dispatch-$$level: $$total_p passed, $$total_f failed, $$total_s skipped"; all_f=$$((all_f + total_f)); \
	done; [ $$all_f -eq 0 ]

# The NEON kernels (src/kernels/neon.c), which only an aarch64 build compiles, under qemu-user:
# the library and NEON_TESTS cross-compiled into build/aarch64, test_kernels run as is (every level
# this build has, bit for bit against the references), the model-level tests with
# G4_DISPATCH=neon. Fails unless test_kernels reports the neon level available and chosen as the
# best one, or if any test warns that G4_DISPATCH=neon fell back to another level.
# AARCH64_DEPS holds the arm64 builds of cJSON and PCRE2 that scripts/install-deps.sh unpacks there
# (Debian ships no static libcjson, so the binaries are dynamic: qemu runs them against the cross
# toolchain's libc, -L below, and finds the two libraries through their rpath).
A64_CC ?= aarch64-linux-gnu-gcc
A64_AR ?= aarch64-linux-gnu-ar
AARCH64_DEPS ?= /opt/g4-aarch64-deps
A64_LIBDIR = $(AARCH64_DEPS)/usr/lib/aarch64-linux-gnu
QEMU_AARCH64 ?= qemu-aarch64 -L /usr/aarch64-linux-gnu
A64_OUT = build/aarch64
NEON_TESTS = test_kernels $(DISPATCH_TESTS)
A64_LIB_OBJ = $(LIB_SRC:%.c=$(A64_OUT)/%.o)
.SECONDARY: $(NEON_TESTS:%=$(A64_OUT)/tests/%.o)

$(AARCH64_DEPS)/usr/include/cjson/cJSON.h:
	@echo "neon-test: no arm64 cJSON/PCRE2 under $(AARCH64_DEPS); run ./scripts/install-deps.sh" >&2; exit 1

$(A64_OUT)/%.o: %.c | $(AARCH64_DEPS)/usr/include/cjson/cJSON.h
	@mkdir -p $(dir $@)
	@$(A64_CC) $(CFLAGS_COMMON) -O2 -g -isystem $(AARCH64_DEPS)/usr/include $(CFLAGS) -c $< -o $@

$(A64_OUT)/libg4.a: $(A64_LIB_OBJ)
	@rm -f $@; $(A64_AR) rcs $@ $^

$(A64_OUT)/tests/%: $(A64_OUT)/tests/%.o $(A64_OUT)/libg4.a
	@$(A64_CC) $(LDFLAGS) -o $@ $^ -L$(A64_LIBDIR) -Wl,-rpath,$(A64_LIBDIR) $(LDLIBS)

neon-test: $(NEON_TESTS:%=$(A64_OUT)/tests/%)
	@total_p=0; total_f=0; total_s=0; \
	for t in $(NEON_TESTS); do \
	  b=$(A64_OUT)/tests/$$t; \
	  if [ $$t = test_kernels ]; then env -u G4_DISPATCH $(QEMU_AARCH64) $$b > $$b.log 2>&1; rc=$$?; \
	  else G4_DISPATCH=neon $(QEMU_AARCH64) $$b > $$b.log 2>&1; rc=$$?; fi; \
	  set -- $$(sh tests/result.sh $$b $$b.log $$rc); p=$$1; f=$$2; s=$$3; \
	  if grep -q 'G4_DISPATCH=neon' $$b.log; then echo "$$b: NEON level not used under qemu"; f=$$((f + 1)); fi; \
	  if [ $$t = test_kernels ] && ! { grep -qx 'ok level neon available' $$b.log && grep -qx 'ok dispatch: best level neon' $$b.log; }; then \
	    echo "$$b: the neon level is not available under qemu"; f=$$((f + 1)); fi; \
	  [ $$f -eq 0 ] || { grep -v '^ok ' $$b.log | tail -20; echo "$$b failed under qemu-aarch64 (log: $$b.log)"; }; \
	  echo "  $$t (aarch64): $$p passed, $$f failed, $$s skipped"; \
	  total_p=$$((total_p + p)); total_f=$$((total_f + f)); total_s=$$((total_s + s)); \
	done; \
	echo "neon-qemu: $$total_p passed, $$total_f failed, $$total_s skipped"; [ $$total_f -eq 0 ]

# The end-to-end quality gate on the built-in trained model (release build only: a few minutes).
quality: $(OUT)/g4 $(OUT)/tests/test_quality
	@G4_BIN=$(OUT)/g4 $(OUT)/tests/test_quality

# Everything CI runs, one stage after another (parallel stages would distort the quality gate's time).
check:
	$(MAKE) test
	$(MAKE) dispatch-test
	$(MAKE) neon-test
	$(MAKE) quality
	$(MAKE) asan-test
	$(MAKE) fuzz

# libFuzzer targets (fuzz/README.md; clang + libclang-rt): `make fuzz` is the short smoke run CI
# does, `make fuzz-run FUZZ_SECONDS=600` the long one.
fuzz:
	$(MAKE) -C fuzz smoke
fuzz-run:
	$(MAKE) -C fuzz run SECONDS=$(or $(FUZZ_SECONDS),60)

clean:
	rm -rf build
	$(MAKE) -C fuzz clean

-include $(shell find $(OUT) $(A64_OUT) -name "*.d" 2>/dev/null)
