# g4 build. `make` builds build/release/g4; `make test` runs every test; `make asan-test` runs
# them again under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan).
#
# -ffp-contract=off: no fused multiply-add contraction anywhere. A 1-ulp difference before an
# int8 rounding can flip a code and fork the generated tokens, so every build and dispatch level
# must evaluate float expressions exactly as written. Never add -ffast-math.

CC      ?= cc
# The runtime (src/) sees include/ and src/ only; the development library (dev/) sees itself too;
# the command (tools/) sees include/, dev/ and itself, never src/; the tests and the benchmarks see
# every tier (TIER_INC per folder below).
CFLAGS_COMMON = -std=c11 -Wall -Wextra -Werror -Wformat-security -ffp-contract=off -pthread -Iinclude $(TIER_INC) -MMD -MP
LDLIBS  = -lcjson -lpcre2-8 -lm -pthread $(MEDIA_LIBS)
# g4 serve's HTTP (libmicrohttpd): the g4 command and the server's tests only, not the library
SERVE_LIBS = -lmicrohttpd
SERVE_OBJ = $(OUT)/tools/serve_cmd.o $(OUT)/tools/serve/request.o $(OUT)/tools/serve/reply.o $(OUT)/tools/serve/engine.o $(OUT)/tools/serve/tokens.o $(OUT)/tools/serve/chat_html.o

BUILD ?= release
ifeq ($(BUILD),asan)
  # -g1: line tables (what a sanitizer's report prints) without the full debug info, which cost
  # a fifth of the sanitizer build's compile time
  OPT = -O1 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
  LDFLAGS_MODE = -fsanitize=address,undefined
else
  OPT = -O2 -g
  LDFLAGS_MODE =
endif
OUT = build/$(BUILD)

include sources.mk

TESTS = test_config test_draft test_bf16 test_quantize test_int8 test_unit_linear test_litert test_kernels test_tanh_monotone test_tokenizer test_chat test_conversation test_tools test_serve test_serve_tokens test_gsm8k test_sampler test_generate test_decode test_stepper test_fixture test_switches test_lmhead_scales test_synth test_broken_checkpoint test_cli test_text_cli test_eval test_options test_eval_shard test_bench_draft test_grammar test_embed test_serve_media test_structured test_vision test_media_cli test_audio
# g4_checkpoint_open (issue 34: one opening of a checkpoint folder for every front end)
TESTS += test_checkpoint
# the one reply reader (issue 34 item 1)
TESTS += test_reply
# the synthesized towers and the BF16 clipped-linear tower goldens (issue 35)
TESTS += test_synth_towers test_bf16_towers
# the built-in JSON model follows a schema given as text (issue 36: instructor Mode.JSON)
TESTS += test_json_model

LIB_OBJ = $(LIB_SRC:%.c=$(OUT)/%.o) $(MEDIA_SRC:%.c=$(OUT)/%.o)
DEV_OBJ = $(DEV_SRC:%.c=$(OUT)/%.o)
TOOL_OBJ = $(OUT)/tools/main.o $(OUT)/tools/cli.o $(OUT)/tools/text_cmds.o $(OUT)/tools/bench_cmd.o $(OUT)/tools/eval_cmd.o $(OUT)/tools/synth_cmd.o $(OUT)/tools/quantize_cmd.o
TEST_BIN = $(TESTS:%=$(OUT)/tests/%)

.PHONY: all test asan-test serve-test dispatch-test neon-test mutation-test quality check clean fuzz fuzz-run install example-test python-test
.SECONDARY: $(OUT)/bench/bench_kernels.o $(TESTS:%=$(OUT)/tests/%.o) $(OUT)/tests/test_quality.o $(TOOL_OBJ) $(SERVE_OBJ)
all: $(OUT)/g4

$(OUT)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(CC) $(CFLAGS_COMMON) $(OPT) $(CFLAGS) -c $< -o $@

# The tiers' include paths: dev/ may use the runtime's internals; tools/ (the g4 command and its
# server) gets the public header and the dev header only, so an internal include there fails to
# build (what tools need of the runtime is in include/g4.h, or in dev/ for development commands);
# tests/ and bench/ (and the cross build's tests) see everything, to test the internals.
$(OUT)/src/%.o $(OUT)/pic/src/%.o: TIER_INC = -Isrc
$(OUT)/dev/%.o: TIER_INC = -Isrc -Idev
$(OUT)/tools/%.o: TIER_INC = -Idev -Itools
$(OUT)/tests/%.o $(OUT)/bench/%.o: TIER_INC = -Isrc -Idev -Itools

# Register-pressure-aware scheduling before allocation keeps the int8 tiles' int16 sums in
# registers (without it GCC 12 spills one per block in the 2-bit prefill loop); it only reorders
# instructions, so results are unchanged.
$(OUT)/src/kernels/avx2.o $(OUT)/pic/src/kernels/avx2.o: CFLAGS += -fschedule-insns -fsched-pressure

# the CLI finds the built-in model (models/) of the tree it was built from
$(OUT)/tools/cli.o: CFLAGS += -DG4_SOURCE_DIR='"$(CURDIR)"' 

$(OUT)/libg4.a: $(LIB_OBJ)
	@rm -f $@; ar rcs $@ $^

# the development library: never part of libg4.a or libg4.so
$(OUT)/libg4dev.a: $(DEV_OBJ)
	@rm -f $@; ar rcs $@ $^

$(OUT)/g4: $(TOOL_OBJ) $(SERVE_OBJ) $(OUT)/libg4dev.a $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(SERVE_LIBS)

# g4 serve's chat page (GET /), one HTML file built into the binary as a C array, with the
# Content-Security-Policy that names its inline script and style by their SHA-256 (perl's Digest::SHA)
$(OUT)/tools/serve/chat_html.c: tools/serve/chat.html tools/serve/embed_page.pl
	@mkdir -p $(dir $@)
	@perl tools/serve/embed_page.pl $< > $@.tmp && mv $@.tmp $@

$(OUT)/tools/serve/chat_html.o: $(OUT)/tools/serve/chat_html.c
	@$(CC) $(CFLAGS_COMMON) $(OPT) $(CFLAGS) -c $< -o $@

# the server's request parser and reply writer (no HTTP in them) under their unit test
$(OUT)/tests/test_serve: $(OUT)/tests/test_serve.o $(OUT)/tools/serve/request.o $(OUT)/tools/serve/reply.o $(OUT)/tools/cli.o $(OUT)/libg4dev.a $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the engine's prompt cache with media spans (serve_job_set_media), over the built-in tiny model
$(OUT)/tests/test_serve_media: $(OUT)/tests/test_serve_media.o $(OUT)/tools/serve/engine.o $(OUT)/tools/serve/request.o $(OUT)/tools/serve/reply.o $(OUT)/tools/serve/tokens.o $(OUT)/tools/cli.o $(OUT)/libg4dev.a $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(OUT)/tests/test_serve_tokens: $(OUT)/tests/test_serve_tokens.o $(OUT)/tools/serve/tokens.o $(OUT)/tools/serve/request.o $(OUT)/tools/cli.o $(OUT)/libg4dev.a $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(OUT)/tests/%: $(OUT)/tests/%.o $(OUT)/libg4dev.a $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The shared library: the same sources compiled position-independent under $(OUT)/pic, exporting only
# the functions include/g4.h declares (a version script made from the header, so the list cannot
# drift from it). Soname libg4.so.$(G4_SOVERSION); the file carries the full version.
G4_VERSION := $(shell sed -n 's/^\#define G4_VERSION "\(.*\)"/\1/p' include/g4.h)
G4_SOVERSION = 0
PIC_OBJ = $(LIB_SRC:%.c=$(OUT)/pic/%.o) $(MEDIA_SRC:%.c=$(OUT)/pic/%.o)
$(OUT)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	@$(CC) $(CFLAGS_COMMON) $(OPT) $(CFLAGS) -fPIC -c $< -o $@

$(OUT)/g4.map: include/g4.h
	@{ echo 'G4_$(G4_SOVERSION) {'; echo '  global:'; \
	   sed -n 's/.*[^a-z0-9_]\(g4_[a-z0-9_]*\)(.*/    \1;/p' $< | sort -u; echo '  local: *;'; echo '};'; } > $@

$(OUT)/libg4.so: $(PIC_OBJ) $(OUT)/g4.map
	@$(CC) -shared $(LDFLAGS_MODE) $(LDFLAGS) -Wl,-soname,libg4.so.$(G4_SOVERSION) -Wl,--version-script,$(OUT)/g4.map \
	  -o $@ $(PIC_OBJ) $(LDLIBS)

# `make install PREFIX=DIR` (default /usr/local; DESTDIR for staging): the g4 command, libg4.a,
# libg4.so with its soname links, include/g4.h and lib/pkgconfig/g4.pc.
PREFIX ?= /usr/local
install: $(OUT)/g4 $(OUT)/libg4.a $(OUT)/libg4.so
	@install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	@install -m 755 $(OUT)/g4 $(DESTDIR)$(PREFIX)/bin/g4
	@install -m 644 include/g4.h $(DESTDIR)$(PREFIX)/include/g4.h
	@install -m 644 $(OUT)/libg4.a $(DESTDIR)$(PREFIX)/lib/libg4.a
	@install -m 755 $(OUT)/libg4.so $(DESTDIR)$(PREFIX)/lib/libg4.so.$(G4_VERSION)
	@ln -sf libg4.so.$(G4_VERSION) $(DESTDIR)$(PREFIX)/lib/libg4.so.$(G4_SOVERSION)
	@ln -sf libg4.so.$(G4_SOVERSION) $(DESTDIR)$(PREFIX)/lib/libg4.so
	@sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(G4_VERSION)|' g4.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/g4.pc
	@echo "installed g4 $(G4_VERSION) under $(DESTDIR)$(PREFIX)"

# examples/ built as a user would: against a fresh install (a private prefix) through pkg-config,
# linked to the shared library, and run on the built-in model; it must print the model's worked
# answer to the README's example problem, and the library must export nothing but g4.h's API.
example-test:
	@set -e; p=$$(mktemp -d); trap 'rm -rf "$$p"' EXIT; \
	$(MAKE) --no-print-directory install PREFIX=$$p >/dev/null; \
	export PKG_CONFIG_PATH=$$p/lib/pkgconfig; \
	$(CC) -std=c11 -Wall -Wextra -Werror -o $$p/answer examples/answer.c $$(pkg-config --cflags --libs g4) -Wl,-rpath,$$p/lib; \
	ldd $$p/answer | grep -q "libg4.so.$(G4_SOVERSION) => $$p/lib/" || { echo "example-test: answer is not linked to the installed libg4.so"; exit 1; }; \
	nm -D --defined-only $$p/lib/libg4.so | awk '$$2 != "A" {sub(/@.*/, "", $$3); print $$3}' | sort > $$p/exported; \
	sed -n 's/^    \(g4_.*\);/\1/p' $(OUT)/g4.map > $$p/api; \
	cmp -s $$p/exported $$p/api || { echo "example-test: libg4.so exports other symbols than g4.h declares:"; \
	  diff $$p/api $$p/exported | head; exit 1; }; \
	G4_TOKENIZER_CACHE=off $$p/answer models/gemma4-tiny-math "$$(cat models/gemma4-tiny-math/example_prompt.txt)" > $$p/out.txt; \
	grep -qx 'The final answer is 890' $$p/out.txt || { cat $$p/out.txt; echo "example-test: no 'The final answer is 890'"; exit 1; }; \
	echo "example-test: 1 passed, 0 failed (examples/answer.c against libg4.so.$(G4_VERSION) from pkg-config)"

# The Python package (python/) as a user gets it: python/run-tests.sh makes a fresh venv, runs
# `pip install ./python pytest` in it (which builds libg4.so here with make) and the pytest tests
# against the installed package and this build's g4 command line (their answers must agree), one of
# them installing the package again against `make install`'s copy through pkg-config. PYTHON=python3.X
# picks the interpreter; PYTEST_ARGS go to pytest. Always the release build (a sanitized library
# cannot be loaded into an uninstrumented Python).
python-test:
	@$(MAKE) -s --no-print-directory BUILD=release build/release/g4 build/release/libg4.so
	@PYTHON=$(or $(PYTHON),python3) G4_BIN=$(CURDIR)/build/release/g4 sh python/run-tests.sh $(PYTEST_ARGS)

# The kernel micro-benchmark (bench/bench_kernels.c): built with the tests so it keeps compiling,
# run by hand (`build/release/bench_kernels [quick]`).
$(OUT)/bench_kernels: $(OUT)/bench/bench_kernels.o $(OUT)/libg4.a
	@$(CC) $(LDFLAGS_MODE) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Runs every test program (tests/run-tests.sh), TEST_JOBS at a time (default: one per CPU); each
# prints "name: N passed, N failed, N skipped", judged by tests/result.sh (no closing line, a bad
# exit or no passed check fails the program). G4_BIN lets tests run the CLI. The shared fixtures
# are reference data: a program that leaves a new entry under them, or changes one, fails
# (listing and timestamps compared around each program).
SHARED_DIR = $(or $(G4_SHARED),../shared)
TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
test: $(OUT)/g4 $(TEST_BIN) $(OUT)/bench_kernels
	@bash tests/run-tests.sh $(BUILD) $(OUT)/g4 $(SHARED_DIR) $(TEST_JOBS) $(TEST_BIN)

# Under the sanitizers the JSON model's test reads 30 of its 120 held-out items (the memory and
# per-reply checks; its accuracy gates are the release run's): the whole set took 160 s there.
asan-test:
	G4_JSON_MODEL_ITEMS=30 $(MAKE) BUILD=asan test
	$(MAKE) BUILD=asan serve-test

# g4 serve on loopback against the official openai client (tests/serve/test_serve.py, in a venv
# with the client that tests/serve/run.sh makes in build/serve-venv on first use): greedy and
# sampled answers equal to g4 run's, streaming, 16 concurrent clients, cancellation, every error,
# tool calls, drain, /metrics and a 500-request load test. Judged like a test program.
# Under ASan, LeakSanitizer checks each server at its exit (test_load's leak check; a leak is a bad exit).
serve-test: $(OUT)/g4
	@$(if $(filter asan,$(BUILD)),ASAN_OPTIONS=detect_leaks=1:$$ASAN_OPTIONS) G4_BIN=$(OUT)/g4 tests/serve/run.sh > $(OUT)/serve-test.log 2>&1; rc=$$?; grep -v '^ok ' $(OUT)/serve-test.log; \
	set -- $$(sh tests/result.sh serve-test $(OUT)/serve-test.log $$rc); \
	echo "$(BUILD) serve-test: $$1 passed, $$2 failed, $$3 skipped (log: $(OUT)/serve-test.log)"; [ $$2 -eq 0 ]

# Structured output through the four clients issue 36 names (openai parse, LangChain
# with_structured_output, instructor, LiteLLM), pinned in tests/clients/requirements.txt and installed
# into build/clients-venv on first use (network for pip; ~3 min). Not in `make check` (CI's time):
# run by hand. One "client:" line per client and mode: requests, valid replies, what else and why.
.PHONY: clients-test
clients-test: $(OUT)/g4
	@G4_BIN=$(OUT)/g4 tests/clients/run.sh > $(OUT)/clients-test.log 2>&1; rc=$$?; grep -E '^(client|clients-test|Traceback)' $(OUT)/clients-test.log; \
	echo "(log: $(OUT)/clients-test.log)"; exit $$rc

# The model-level tests again under each kernel level forced with G4_DISPATCH: every level must
# give the same tokens (and, by construction, the same bits) on the fixtures. `make test` runs the
# best level the CPU has; this runs the others too. The levels are the table's in
# src/kernels/levels.h (its LEVEL lines), the portable one first. A level this build or CPU lacks
# is skipped by each program with a printed reason (tests/testutil.h, check_dispatch_level): on
# x86, NEON, which runs under qemu (neon-test).
DISPATCH_TESTS = test_fixture test_generate test_decode test_switches test_unit_linear test_bf16 test_embed
DISPATCH_LEVELS := $(shell sed -n 's/^ *LEVEL(\([a-z0-9_]*\)).*/\1/p' src/kernels/levels.h | tac)
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
A64_DEV_OBJ = $(DEV_SRC:%.c=$(A64_OUT)/%.o)
$(A64_OUT)/src/%.o: TIER_INC = -Isrc
$(A64_OUT)/dev/%.o: TIER_INC = -Isrc -Idev
$(A64_OUT)/tests/%.o: TIER_INC = -Isrc -Idev -Itools
.SECONDARY: $(NEON_TESTS:%=$(A64_OUT)/tests/%.o)

$(AARCH64_DEPS)/usr/include/cjson/cJSON.h:
	@echo "neon-test: no arm64 cJSON/PCRE2 under $(AARCH64_DEPS); run ./scripts/install-deps.sh" >&2; exit 1

$(A64_OUT)/%.o: %.c | $(AARCH64_DEPS)/usr/include/cjson/cJSON.h
	@mkdir -p $(dir $@)
	@$(A64_CC) $(CFLAGS_COMMON) -O2 -g -isystem $(AARCH64_DEPS)/usr/include $(CFLAGS) -c $< -o $@

$(A64_OUT)/libg4.a: $(A64_LIB_OBJ)
	@rm -f $@; $(A64_AR) rcs $@ $^

$(A64_OUT)/libg4dev.a: $(A64_DEV_OBJ)
	@rm -f $@; $(A64_AR) rcs $@ $^

$(A64_OUT)/tests/%: $(A64_OUT)/tests/%.o $(A64_OUT)/libg4dev.a $(A64_OUT)/libg4.a
	@$(A64_CC) $(LDFLAGS) -o $@ $^ -L$(A64_LIBDIR) -Wl,-rpath,$(A64_LIBDIR) $(filter-out $(MEDIA_LIBS),$(LDLIBS))

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

# Mutation testing (scripts/mutation-test.sh): each mutant of tests/mutations.txt, applied alone to
# a copy of the tree in a temporary folder (never to this one), must make one of the release TESTS
# fail. MUTATIONS="NAME ..." runs only those. Its cost: README, "what make check runs" (the list has its count:
# `scripts/mutation-test.sh --check`).
mutation-test:
	@G4_SHARED=$(SHARED_DIR) scripts/mutation-test.sh $(MUTATIONS)

# The end-to-end quality gate on the built-in trained model (release build only: a few minutes).
quality: $(OUT)/g4 $(OUT)/tests/test_quality
	@G4_BIN=$(OUT)/g4 $(OUT)/tests/test_quality

# Everything CI runs, one stage after another (parallel stages would distort the quality gate's
# time); each stage's wall time is printed ("check: STAGE took N s"; README, "what make check runs").
CHECK_STAGES = test serve-test example-test python-test mutation-test dispatch-test neon-test quality asan-test fuzz
check:
	@t0=$$(date +%s); for stage in $(CHECK_STAGES); do \
	  t=$$(date +%s); $(MAKE) $$stage; rc=$$?; \
	  echo "check: $$stage took $$(($$(date +%s) - t)) s$$([ $$rc -eq 0 ] || echo ', FAILED')"; [ $$rc -eq 0 ] || exit $$rc; \
	done; echo "check: every stage passed in $$(($$(date +%s) - t0)) s"

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
