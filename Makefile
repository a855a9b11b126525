# SPDX-License-Identifier: BSD-3-Clause
# Makefile for attngen: the library (generator + runtime: libattngen.a and
# libattngen.so, which export only include/attngen.h), the tools library
# (selfcheck + the float64 reference, for the CLI, tests and bench), the CLI
# and the Check test suite. `make` builds, `make test` runs the tests (GPU
# tests skip with a printed reason when no driver or device is present),
# `make demo` generates and compiles every bundled spec and, on a GPU, runs
# and checks each one.

CUDA_HOME ?= /usr/local/cuda
CC ?= cc
CFLAGS ?= -O2 -g
# -fvisibility=hidden: only declarations marked AG_API (include/attngen.h)
# are exported from libattngen.so.
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter -fPIC \
  -fvisibility=hidden
CPPFLAGS += -Iinclude -Igenerator -Iruntime -Ireference -Itools/lib -I$(CUDA_HOME)/include
YAML_LIBS := -lyaml
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -pthread)
# NVRTC_RPATH: the RUNPATH of libattngen.so and the CLI, where libnvrtc.so.N
# is found at run time. The toolkit's lib64 by default (a fixed system path,
# never the build tree; DT_RUNPATH, so LD_LIBRARY_PATH still wins); empty
# (`make NVRTC_RPATH=`) leaves it to ld.so.conf or LD_LIBRARY_PATH, as a
# distribution package would.
NVRTC_RPATH ?= $(CUDA_HOME)/lib64
comma := ,
# NVRTC is loaded with dlopen on the first compile (runtime/nvrtc_lib.c),
# never linked: the RUNPATH is where it is found, and AG_NVRTC_DIR the last
# place tried.
CUDA_LIBS := $(if $(NVRTC_RPATH),-Wl$(comma)-rpath$(comma)$(NVRTC_RPATH))
CPPFLAGS += -DAG_NVRTC_DIR='"$(CUDA_HOME)/lib64"'
SYS_LIBS := -ldl -lpthread -lm

B := build
# The shared library's version is the header's; its SONAME carries the ABI:
# the major, or before 1.0 major.minor (a 0.x minor release may change the
# ABI: 0.2 did, ag_jagged_backward_workspace_bytes; 0.3 too, the jagged
# argument structs' rotary tables; 0.4 the block argument structs' row
# strides; 0.5 their kv_heads; 0.6 ag_spec's row_strides; 0.7 the broadcast
# argument structs' rotary tables). libattngen.so.0.7.0
# with symlinks libattngen.so.0.7 (the SONAME) and libattngen.so (for the link line and
# the Python binding).
VERSION := $(shell sed -n 's/^\#define AG_VERSION_STRING "\([0-9.]*\)".*/\1/p' include/attngen.h)
SO_MAJOR := $(firstword $(subst ., ,$(VERSION)))
SO_MINOR := $(word 2,$(subst ., ,$(VERSION)))
SONAME := libattngen.so.$(SO_MAJOR)$(if $(filter 0,$(SO_MAJOR)),.$(SO_MINOR))
GEN_SRC := $(wildcard generator/*.c)
RT_SRC := $(wildcard runtime/*.c)
# The tools library: not part of libattngen; every reference/*.c is in it.
TOOLS_SRC := $(wildcard tools/lib/*.c) $(wildcard reference/*.c)
TEMPLATES := $(sort $(wildcard templates/*.cu templates/*.cuh))
TEST_SRC := $(wildcard tests/check_*.c) tests/util.c tests/fake_driver.c

GEN_OBJ := $(GEN_SRC:%.c=$(B)/%.o) $(B)/templates_embedded.o
RT_OBJ := $(RT_SRC:%.c=$(B)/%.o)
TOOLS_OBJ := $(TOOLS_SRC:%.c=$(B)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(B)/%.o)

.PHONY: all deps test test-quick demo clean install uninstall test-install test-pip examples FORCE
all: $(B)/attngen $(B)/libattngen.a $(B)/libattngen.so $(B)/libattngen_tools.a

# Installs libyaml, Check and pkg-config with apt-get when they are missing.
deps:
	@tools/deps.sh

# Every object records the headers it includes in a .d file beside it
# (-MMD; -MP: a header since removed is no error), read at the end of this
# file: a changed header rebuilds exactly the objects that include it. The
# Makefile itself is a prerequisite (its flags; and a tree built before the
# .d files existed rebuilds once).
DEPFLAGS := -MMD -MP
$(B)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# Templates are embedded as C strings; the tool writes a temporary file and
# renames it only when the whole output was written.
$(B)/embed: tools/embed.c
	@mkdir -p $(B)
	$(CC) -O2 -Wall -Wextra -o $@ $<
$(B)/templates_embedded.c: $(B)/embed $(TEMPLATES)
	$(B)/embed $@ $(TEMPLATES)
$(B)/templates_embedded.o: $(B)/templates_embedded.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(B)/libattngen_gen.a: $(GEN_OBJ)
	rm -f $@ && ar rcs $@ $^
$(B)/libattngen.a: $(GEN_OBJ) $(RT_OBJ)
	rm -f $@ && ar rcs $@ $^
# -z defs: every symbol the library uses must resolve at link time, so code
# in generator/ or runtime/ that calls into the tools library fails here.
$(B)/libattngen.so.$(VERSION): $(GEN_OBJ) $(RT_OBJ)
	$(CC) -shared -Wl,-z,defs -Wl,-soname,$(SONAME) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)
$(B)/$(SONAME): $(B)/libattngen.so.$(VERSION)
	ln -sfn libattngen.so.$(VERSION) $@
$(B)/libattngen.so: $(B)/$(SONAME)
	ln -sfn $(SONAME) $@
# Selfcheck and the reference; they use the runtime's internals, so whatever
# links this links the static libattngen.a after it.
$(B)/libattngen_tools.a: $(TOOLS_OBJ)
	rm -f $@ && ar rcs $@ $^
TOOLS_LINK := $(B)/libattngen_tools.a $(B)/libattngen.a

$(B)/attngen: $(B)/cli/main.o $(B)/cli/build.o $(TOOLS_LINK)
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

$(B)/check_attngen: $(TEST_OBJ) $(TOOLS_LINK)
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(CHECK_LIBS) $(SYS_LIBS)

# The test command of the README: the Check suite (GPU tests print SKIP and
# pass without a driver or device).
test: deps
	$(MAKE) $(B)/check_attngen $(B)/attngen $(B)/libattngen.so $(B)/tune_block
	cd tests && ATTNGEN_BIN=../$(B)/attngen TUNE_BLOCK_BIN=../$(B)/tune_block \
	  ATTNGEN_SO=../$(B)/libattngen.so ../$(B)/check_attngen
	$(MAKE) test-install
	$(MAKE) test-build
	$(MAKE) test-pip
	@if python3 -c 'import pytest' 2>/dev/null; then \
	  python3 -m pytest -q -rs bindings/python/tests bench/tests; \
	else echo "SKIP python binding tests: pytest is not installed (pip install pytest)"; fi

# ---- install (PREFIX, DESTDIR; `make uninstall` removes exactly these) -----
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL ?= install
# libyaml through its own .pc where it has one (Debian's libyaml-dev does).
YAML_PC := $(shell pkg-config --exists yaml-0.1 2>/dev/null && echo yaml-0.1)
INSTALLED := $(BINDIR)/attngen $(LIBDIR)/libattngen.a $(LIBDIR)/libattngen.so.$(VERSION) \
  $(LIBDIR)/$(SONAME) $(LIBDIR)/libattngen.so $(INCLUDEDIR)/attngen.h \
  $(PKGCONFIGDIR)/attngen.pc

# Rewritten only when its text changes (a new PREFIX), so installs are
# idempotent and nothing relinks.
$(B)/attngen.pc: attngen.pc.in FORCE
	@mkdir -p $(B)
	@sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(patsubst $(PREFIX)%,$${prefix}%,$(LIBDIR))|' \
	  -e 's|@INCLUDEDIR@|$(patsubst $(PREFIX)%,$${prefix}%,$(INCLUDEDIR))|' \
	  -e 's|@CUDALIBDIR@|$(CUDA_HOME)/lib64|' -e 's|@VERSION@|$(VERSION)|' \
	  -e 's|@REQUIRES_PRIVATE@|$(YAML_PC)|' -e 's|@YAML_PRIVATE@|$(if $(YAML_PC),,-lyaml )|' \
	  -e '/^#/d' $< >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi
FORCE:

install: all $(B)/attngen.pc
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR) \
	  $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 755 $(B)/attngen $(DESTDIR)$(BINDIR)/attngen
	$(INSTALL) -m 644 $(B)/libattngen.a $(DESTDIR)$(LIBDIR)/libattngen.a
	$(INSTALL) -m 755 $(B)/libattngen.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libattngen.so.$(VERSION)
	ln -sfn libattngen.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sfn $(SONAME) $(DESTDIR)$(LIBDIR)/libattngen.so
	$(INSTALL) -m 644 include/attngen.h $(DESTDIR)$(INCLUDEDIR)/attngen.h
	$(INSTALL) -m 644 $(B)/attngen.pc $(DESTDIR)$(PKGCONFIGDIR)/attngen.pc

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	-rmdir $(DESTDIR)$(PKGCONFIGDIR) 2>/dev/null || true

# Installs into a temporary DESTDIR, builds tests/install/emit_spec.c with
# nothing but `pkg-config --cflags --libs attngen` (shared, then --static),
# runs it (parse a spec, emit CUDA C: no GPU), then uninstalls.
test-install: all
	tools/test_install.sh

# `attngen build` on two bundled specs: the headers compile as C and C++,
# and a program linked with the generated _kernels.c files checks the
# embedded cubins and specs (tools/test_build.sh).
# `pip install ./bindings/python` into a fresh venv bundles libattngen.so and
# the installed package loads it (tools/test_pip.sh; skips without venv).
test-pip:
	tools/test_pip.sh

test-build: $(B)/attngen $(B)/libattngen.a
	B=$(B) tools/test_build.sh

# examples/ against a staged install of this tree (build/stage), as a user
# would build it: the installed attngen generates and compiles the two
# variants, pkg-config gives the link line; then the program runs (77 means
# no GPU: skipped) and the README's C example is checked to be examples/attention.c.
STAGE := $(CURDIR)/$(B)/stage
examples: all
	$(MAKE) --no-print-directory install DESTDIR=$(STAGE) PREFIX=/usr/local >/dev/null
	$(MAKE) -C examples OUT=$(CURDIR)/$(B)/examples CFLAGS="-O2 -Wall -Wextra -Werror" \
	  ATTNGEN=$(STAGE)/usr/local/bin/attngen \
	  PKG_CONFIG_PATH=$(STAGE)/usr/local/lib/pkgconfig$(if $(PKG_CONFIG_PATH),:$(PKG_CONFIG_PATH)) \
	  PKG_CONFIG_SYSROOT_DIR=$(STAGE)
	@deps=$$(LD_LIBRARY_PATH=$(STAGE)/usr/local/lib ldd $(B)/examples/attention 2>&1); \
	  if echo "$$deps" | grep -q nvrtc; then \
	    echo "examples: FAIL: the example links libnvrtc:"; echo "$$deps"; exit 1; fi; \
	  echo "examples: the binary needs no libnvrtc (ldd)"
	@rc=0; cd examples && LD_LIBRARY_PATH=$(STAGE)/usr/local/lib$(if $(LD_LIBRARY_PATH),:$(LD_LIBRARY_PATH)) \
	  ATTNGEN_CACHE_DIR=$(CURDIR)/$(B)/examples/cache $(CURDIR)/$(B)/examples/attention \
	  specs/ex_block64_d64.yaml specs/ex_block32_d128_causal.yaml || rc=$$?; \
	  case $$rc in 0) echo "examples: PASS";; 77) echo "examples: built; run SKIPPED (no GPU)";; \
	  *) echo "examples: FAIL ($$rc)"; exit 1;; esac
	@awk '/^```c$$/{on=1;next} /^```$$/{if(on)exit} on' README.md | cmp -s - examples/attention.c \
	  || { echo "examples: README.md's C example is not examples/attention.c" >&2; exit 1; }

# The fast CPU suites (no NVRTC compile of every spec, no concurrency
# stress), under a minute on two cores; `make test` runs them all.
# AG_SUITES picks suites for the runner (tests/check_main.c).
QUICK_SUITES := error,spec,expand,plan,emit,cache,runtime,cli,gpu,hostile,args,reference,exports,schedule
test-quick: deps
	$(MAKE) $(B)/check_attngen $(B)/attngen $(B)/libattngen.so $(B)/tune_block
	cd tests && AG_SUITES=$(QUICK_SUITES) ATTNGEN_BIN=../$(B)/attngen \
	  TUNE_BLOCK_BIN=../$(B)/tune_block ATTNGEN_SO=../$(B)/libattngen.so ../$(B)/check_attngen

demo: deps
	$(MAKE) all
	tools/demo.sh $(B)/attngen

clean:
	rm -rf $(B)

# Plan-tuning tool for the GPU machine (not part of `all`).
$(B)/tune_block: $(B)/tools/tune/tune_block.o $(TOOLS_LINK)
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

# Per-CTA timeline of the forward (tools/tune/cta_timeline.c; not part of `all`).
$(B)/cta_timeline: $(B)/tools/tune/cta_timeline.o $(TOOLS_LINK)
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

# The C launch path's own cost a call, no GPU (tools/tune/launch_cost.c; not part of `all`).
$(B)/launch_cost: $(B)/tools/tune/launch_cost.o $(TOOLS_LINK)
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

# ---- reliability: sanitizers, fuzzing, valgrind (docs/reliability.md) -------
# Each target builds into its own directory with the sanitizer flags folded
# into CC (the link rules above take no CFLAGS), so `build/` is untouched.

SAN_COMMON := -fno-omit-frame-pointer
ASAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined $(SAN_COMMON)
TSAN_FLAGS := -fsanitize=thread $(SAN_COMMON)
ASAN_RUN := detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
ASAN_RUN := $(ASAN_RUN):protect_shadow_gap=0
# LeakSanitizer's tracer reads the dynamic-TLS blocks that the
# __tls_get_addr interceptor records; with NVRTC loaded, one record is bogus
# (0xb6e-0x2000001c70 in a verbosity=1 log) and the tracer dies on it at a
# test's exit ("Tracer caught signal 11"). attngen keeps nothing in
# thread-local storage, so no root of ours is lost by not recording them.
ASAN_RUN := $(ASAN_RUN):intercept_tls_get_addr=0
# A sanitizer's report goes to its own file (a forked test's stderr is lost
# among the suite's output) and is printed after the run; exit code 86 tells
# a sanitizer's verdict apart from a test that exits 1 itself.
ASAN_EXIT := 86
ASAN_LOG := $(CURDIR)/build-asan/reports/san
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_FLAGS := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  $(SAN_COMMON)
# Only definite and indirect leaks count as errors; NVRTC keeps "possibly
# lost" blocks alive for the life of the process. 99 tells valgrind's
# verdict apart from attngen's own exit codes (1: an invalid spec).
VALGRIND := valgrind -q --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --error-exitcode=99
VALGRIND_BAD := tests/spec_errors/alias_bomb.yaml tests/spec_errors/binary_png.yaml \
  tests/spec_errors/many_errors_in_order.yaml tests/spec_errors/too_deep.yaml \
  tests/spec_errors/unsupported_rotary_base_backward.yaml

.PHONY: asan tsan fuzz valgrind

# The CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer, every
# suite, each test forked. LeakSanitizer is on (tests/lsan.supp: no rule is
# needed today). protect_shadow_gap=0 lets the CUDA driver map memory where
# it must, should a GPU be present.
asan: deps
	$(MAKE) B=build-asan CC="$(CC) $(ASAN_FLAGS)" build-asan/check_attngen build-asan/attngen \
	  build-asan/tune_block build-asan/libattngen.so
	rm -rf build-asan/reports && mkdir -p build-asan/reports
	cd tests && CK_FORK=yes ATTNGEN_BIN=../build-asan/attngen TUNE_BLOCK_BIN=../build-asan/tune_block \
	  ATTNGEN_SO=../build-asan/libattngen.so \
	  ASAN_OPTIONS=$(ASAN_RUN):exitcode=$(ASAN_EXIT):log_path=$(ASAN_LOG) \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(ASAN_LOG) \
	  ASAN_REPORTS=$(CURDIR)/build-asan/reports ASAN_EXIT=$(ASAN_EXIT) \
	  ../tools/asan_run.sh ../build-asan/check_attngen

# The concurrency suite under ThreadSanitizer; tests/tsan.supp ignores only
# the interceptor calls made from inside libnvrtc (it is not instrumented).
tsan: deps
	$(MAKE) B=build-tsan CC="$(CC) $(TSAN_FLAGS)" build-tsan/check_attngen
	cd tests && CK_FORK=yes CK_RUN_SUITE=concurrency \
	  TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	  ../build-tsan/check_attngen

# libFuzzer over the spec front end for FUZZ_SECONDS. New inputs go to
# build-fuzz/corpus; a crash, leak or timeout leaves its input in build-fuzz/
# and fails the target.
build-fuzz/templates_embedded.c: $(B)/embed $(TEMPLATES)
	@mkdir -p build-fuzz
	$(B)/embed $@ $(TEMPLATES)
build-fuzz/fuzz_spec build-fuzz/fuzz_names: build-fuzz/%: tests/fuzz/%.c $(GEN_SRC) \
    build-fuzz/templates_embedded.c $(wildcard include/*.h generator/*.h)
	$(FUZZ_CC) $(FUZZ_FLAGS) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
	  $(CPPFLAGS) -o $@ $(filter %.c,$^) $(YAML_LIBS) -lm
# The cache reader and what it calls.
FUZZ_CACHE_SRC := runtime/cache.c runtime/sha256.c runtime/fileio.c runtime/env.c generator/error.c
build-fuzz/fuzz_cache: tests/fuzz/fuzz_cache.c $(FUZZ_CACHE_SRC) \
    $(wildcard include/*.h generator/*.h runtime/*.h)
	@mkdir -p build-fuzz
	$(FUZZ_CC) $(FUZZ_FLAGS) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter \
	  $(CPPFLAGS) -o $@ $(filter %.c,$^)
FUZZ_RUN = -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix=build-fuzz/$(1)- -print_final_stats=1
# The three targets in turn, FUZZ_SECONDS each: the spec front end, the same
# with arbitrary source names, the cache reader.
fuzz: deps build-fuzz/fuzz_spec build-fuzz/fuzz_names build-fuzz/fuzz_cache
	@mkdir -p build-fuzz/corpus build-fuzz/corpus-names build-fuzz/corpus-cache
	build-fuzz/fuzz_spec $(call FUZZ_RUN,spec) -max_len=8192 -dict=tests/fuzz/spec.dict \
	  build-fuzz/corpus tests/fuzz/corpus specs tests/spec_errors
	build-fuzz/fuzz_names $(call FUZZ_RUN,names) -max_len=8192 -dict=tests/fuzz/spec.dict \
	  build-fuzz/corpus-names tests/fuzz/corpus specs
	build-fuzz/fuzz_cache $(call FUZZ_RUN,cache) -max_len=4096 build-fuzz/corpus-cache

# The CLI under valgrind memcheck: check, emit and compile (cold, then from
# the disk cache) on the bundled specs, and check/emit/compile on bad specs.
valgrind: deps
	$(MAKE) $(B)/attngen
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	export ATTNGEN_CACHE_DIR="$$tmp/cache"; unset ATTNGEN_CACHE_DISABLE ATTNGEN_DUMP_DIR; \
	vg() { want=$$1; shift; echo "valgrind attngen $$*"; rc=0; \
	  $(VALGRIND) $(B)/attngen "$$@" >"$$tmp/out" 2>"$$tmp/log" || rc=$$?; \
	  if [ $$rc -ne $$want ]; then cat "$$tmp/log" >&2; \
	    echo "valgrind: 'attngen $$*' exited $$rc (expected $$want; 99: memcheck errors)" >&2; \
	    exit 1; fi; }; \
	vg 0 check specs/*.yaml; \
	for s in specs/*.yaml; do \
	  vg 0 emit $$s -o "$$tmp/k.cu"; vg 0 compile $$s -o "$$tmp/k.cubin"; done; \
	vg 0 compile specs/$$(ls specs | head -n1) -o "$$tmp/k.cubin"; \
	for s in $(VALGRIND_BAD); do vg 1 check $$s; vg 1 emit $$s; vg 1 compile $$s -o "$$tmp/x"; done; \
	vg 2 compile; \
	echo "valgrind: clean"

# The headers each object included when it was last built (see DEPFLAGS).
-include $(wildcard $(B)/*/*.d $(B)/*/*/*.d)
