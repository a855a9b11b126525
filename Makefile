# Makefile for attngen: the generator library, the runtime library, the CLI
# and the Check test suite. `make` builds, `make test` runs the tests (GPU
# tests skip with a printed reason when no driver or device is present),
# `make demo` generates and compiles every bundled spec and, on a GPU, runs
# and checks each one.

CUDA_HOME ?= /usr/local/cuda
CC ?= cc
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wno-unused-parameter -fPIC
CPPFLAGS += -Iinclude -Igenerator -Iruntime -Ireference -I$(CUDA_HOME)/include
YAML_LIBS := -lyaml
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null || echo -lcheck -lsubunit -lrt -lm -pthread)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnvrtc
SYS_LIBS := -ldl -lpthread -lm

B := build
GEN_SRC := $(wildcard generator/*.c)
RT_SRC := $(wildcard runtime/*.c) $(wildcard reference/*.c)
TEMPLATES := $(sort $(wildcard templates/*.cu templates/*.cuh))
TEST_SRC := $(wildcard tests/check_*.c) tests/util.c

GEN_OBJ := $(GEN_SRC:%.c=$(B)/%.o) $(B)/templates_embedded.o
RT_OBJ := $(RT_SRC:%.c=$(B)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(B)/%.o)

.PHONY: all deps test demo clean
all: $(B)/attngen $(B)/libattngen.a $(B)/libattngen.so

# Installs libyaml, Check and pkg-config with apt-get when they are missing.
deps:
	@tools/deps.sh

$(B)/%.o: %.c $(wildcard include/*.h generator/*.h runtime/*.h reference/*.h tests/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

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
$(B)/libattngen.so: $(GEN_OBJ) $(RT_OBJ)
	$(CC) -shared -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

$(B)/attngen: $(B)/cli/main.o $(B)/libattngen.a
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)

$(B)/check_attngen: $(TEST_OBJ) $(B)/libattngen.a
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(CHECK_LIBS) $(SYS_LIBS)

# The test command of the README: the Check suite (GPU tests print SKIP and
# pass without a driver or device).
test: deps
	$(MAKE) $(B)/check_attngen $(B)/attngen $(B)/libattngen.so
	cd tests && ATTNGEN_BIN=../$(B)/attngen ../$(B)/check_attngen
	@if python3 -c 'import pytest' 2>/dev/null; then \
	  python3 -m pytest -q -rs bindings/python/tests; \
	else echo "SKIP python binding tests: pytest is not installed (pip install pytest)"; fi

demo: deps
	$(MAKE) all
	tools/demo.sh $(B)/attngen

clean:
	rm -rf $(B)

# Plan-tuning tool for the GPU machine (not part of `all`).
$(B)/tune_block: $(B)/bench/tune_block.o $(B)/libattngen.a
	$(CC) -o $@ $^ $(YAML_LIBS) $(CUDA_LIBS) $(SYS_LIBS)
