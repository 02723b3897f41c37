# nabla — GNU Makefile. `make` builds build/libnabla.{a,so} and build/nabla.pc.
#   make test        install missing Debian deps, check the layering (scripts/check_layers.sh),
#                    build, run the Criterion suite
#   make test SAN=1  the same under AddressSanitizer + UBSan (build-san/; CC=clang: build-san-clang/)
#   make test TSAN=1 the thread tests under ThreadSanitizer (build-tsan/)
#   make fuzz        the libFuzzer target (clang, build-fuzz/) for FUZZ_SECS s; make fuzz-ci in CI
#   make test-allocfail  every allocation of a training step failed in turn (build-san/)
#   make demo        build and run the examples
#   make bench       benchmarks (bench/README.md)
#   make install PREFIX=/usr/local
#   make CC=clang    any C11 compiler; -Wall -Wextra -Werror throughout
VERSION := 0.1.0
SOVER := 0
PREFIX ?= /usr/local
CC ?= cc
ifeq ($(origin CC),default)
CC := gcc
endif

ifeq ($(SAN),1)
# clang's sanitizer runtime is not gcc's: a clang build has its own folder
BUILD ?= build-san$(if $(findstring clang,$(CC)),-clang)
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
else ifeq ($(FUZZ),1)
# make fuzz / make fuzz-ci (clang): the library instrumented for libFuzzer's
# coverage, under AddressSanitizer + UBSan.
BUILD ?= build-fuzz
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
  -fno-sanitize-recover=undefined
LDSAN := -fsanitize=address,undefined
else ifeq ($(TSAN),1)
# ThreadSanitizer checks the threads of the application (test/test_threads.c):
# its tests run with OMP_NUM_THREADS=1, so kernels run on the calling thread
# (libgomp is not instrumented: its barriers would read as races), and the
# multiversioned kernels keep their default clone (TSan cannot run ifunc
# resolvers before it starts).
BUILD ?= build-tsan
OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=thread -DNBI_NO_CLONES
LDSAN := -fsanitize=thread
else
BUILD ?= build
OPT := -O3 -g
LDSAN :=
endif

# -ffp-contract=off -fno-trapping-math -fno-math-errno: kernels compile once per
# ISA and must give the same bits on each (no FMA contraction); gcc vectorizes
# float selects and sqrt only without trapping math and errno (src/backends/cpu/vmath.h).
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) -fPIC -fopenmp -Wall -Wextra -Werror \
  -Wno-unknown-pragmas -ffp-contract=off -fno-trapping-math -fno-math-errno -Iinclude $(CFLAGS)
LIBS := -ldnnl -lopenblas -lm -ldl
LDFLAGS_ALL := -fopenmp $(LDSAN) $(LDFLAGS)

SRCS := $(sort $(wildcard src/core/*.c src/ops/*.c src/transforms/*.c src/sharding/*.c \
                          src/autoshard/*.c src/train/*.c src/nn/*.c src/io/*.c \
                          src/backends/cpu/*.c src/backends/emu/*.c src/backends/mpi/*.c))

# make MPI=1: the processes of an mpirun job (src/backends/mpi/README.md) through
# Debian's Open MPI (scripts/deps.sh mpi installs it); without it the job is one
# process.
ifeq ($(MPI),1)
override BUILD := $(BUILD)-mpi
CFLAGS_ALL += -DNABLA_MPI=1 $(shell pkg-config --cflags ompi-c 2>/dev/null)
LIBS += $(shell pkg-config --libs ompi-c 2>/dev/null)
endif

# make CUDA=1: the CUDA backend (src/backends/cuda/README.md) in the same library,
# in its own build folder. Its libraries (driver API, NVRTC, cuBLASLt) are opened
# with dlopen at run time; the toolkit's headers are needed to build.
ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
override BUILD := $(BUILD)-cuda
SRCS += $(sort $(wildcard src/backends/cuda/*.c))
CFLAGS_ALL += -DNABLA_CUDA=1 -isystem $(CUDA_HOME)/include
LIBS += -ldl -lpthread
endif
OBJS := $(SRCS:%.c=$(BUILD)/obj/%.o)
HDRS := $(wildcard include/nabla/*.h src/*/*.h src/backends/*.h src/backends/*/*.h \
                   src/ops/*.def)

LIB_A := $(BUILD)/libnabla.a
LIB_SO := $(BUILD)/libnabla.so.$(VERSION)
PC := $(BUILD)/nabla.pc

TEST_SRCS := $(sort $(wildcard test/test_*.c))
TEST_BIN := $(BUILD)/test/nabla_tests
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(sort $(wildcard examples/*.c)))
BENCHES := $(patsubst bench/%.c,$(BUILD)/bench/%,$(sort $(wildcard bench/*.c)))

.PHONY: all deps check-layers test test-mpi bench-mpi test-cuda-host demo bench bench-gpt bench-loaded bench-smoke install install-check uninstall clean format check-cxx

all: $(LIB_A) $(LIB_SO) $(PC)

deps:
	@scripts/deps.sh

# Includes across the layering (ARCHITECTURE.md; the rules are in the script).
check-layers:
	@sh scripts/check_layers.sh

$(BUILD)/obj/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIB_A): $(OBJS)
	@rm -f $@
	ar rcs $@ $^

$(LIB_SO): $(OBJS)
	$(CC) -shared -Wl,-soname,libnabla.so.$(SOVER) $(LDFLAGS_ALL) -o $@ $^ $(LIBS)
	ln -sf libnabla.so.$(VERSION) $(BUILD)/libnabla.so.$(SOVER)
	ln -sf libnabla.so.$(SOVER) $(BUILD)/libnabla.so

$(PC): nabla.pc.in
	@mkdir -p $(BUILD)
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' $< > $@

# One object per test file (a change rebuilds only its file); a header change
# rebuilds them all.
TEST_OBJS := $(TEST_SRCS:%.c=$(BUILD)/obj/%.o)
$(BUILD)/obj/test/%.o: test/%.c $(wildcard test/*.h) $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itest -c $< -o $@

$(TEST_BIN): $(TEST_OBJS) $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(TEST_OBJS) -o $@ $(LIB_A) $(LDFLAGS_ALL) -lcriterion $(LIBS)

# The suite runs twice: on the CPU, then with the emulated device NB_EMU(0) as every
# thread's default (docs/devices.md), so any host access that bypasses the device seam
# crashes a test. The emulated device plans and fuses as the CPU does (same groups, same
# kernel counts), so the second pass leaves out only the CUDA suites; it is skipped when
# TEST_ARGS selects tests.
# The CPU kernels' instruction-set paths (src/backends/cpu/vmath.h): the suite's
# first pass runs the best one the CPU has; the numeric suites run again on each
# lower one (portable; avx2 too where the CPU has AVX-512).
ISA_PASSES := portable $(shell grep -q -m1 -w avx512f /proc/cpuinfo 2>/dev/null && echo avx2)
ISA_SUITES := vmath|elementwise|ew_blocks|reduce|rows_large|fusion|nn|gemm_small|gemm_epi|golden|grad_nn
EMU_SKIP := cuda*
# make test TSAN=1: the thread tests (test/test_threads.c) as a standalone
# binary (Criterion cannot run under ThreadSanitizer; test/mini_criterion.h).
THREAD_TEST := $(BUILD)/test/thread_tests
$(THREAD_TEST): test/test_threads.c test/common.h test/mini_criterion.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -DTC_STANDALONE -Itest $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

# make MPI=1 test-mpi: the job and its collectives under mpirun, 2 and 4
# processes (test/mpi/test_mpi.c), and a rank that never arrives: the others
# must end the job with NB_ERR_DISTRIBUTED within the deadline.
MPI_TEST := $(BUILD)/test/test_mpi
MPIRUN := mpirun --allow-run-as-root --oversubscribe
ifeq ($(SAN),1)
# under ASan: Open MPI's own allocations it never frees are suppressed
# (test/mpi/lsan.supp; full stacks so they match, MCA components kept loaded)
MPIRUN := ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/test/mpi/lsan.supp \
  OMPI_MCA_mca_base_component_disable_dlclose=1 $(MPIRUN) -x ASAN_OPTIONS -x LSAN_OPTIONS \
  -x OMPI_MCA_mca_base_component_disable_dlclose
endif
$(MPI_TEST): test/mpi/test_mpi.c test/common.h test/mini_criterion.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itest $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

# test/mpi/test_mpi_mesh.c: meshes spanning the processes (nb_mesh_world), every
# value against the same program on a virtual mesh in one process, MLP training;
# then a rank killed before a collective: the others end the job.
MPI_MESH_TEST := $(BUILD)/test/test_mpi_mesh
$(MPI_MESH_TEST): test/mpi/test_mpi_mesh.c test/common.h test/mini_criterion.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itest $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

test-mpi:
	@if [ "$(MPI)" != 1 ]; then echo "test-mpi: needs make MPI=1 test-mpi"; exit 1; fi
	@scripts/deps.sh mpi
	@$(MAKE) --no-print-directory MPI=1 $(MPI_TEST) $(MPI_MESH_TEST)
	$(MPIRUN) -np 1 $(MPI_TEST)
	$(MPIRUN) -np 2 $(MPI_TEST)
	$(MPIRUN) -np 4 $(MPI_TEST)
	OMP_NUM_THREADS=1 $(MPIRUN) -x OMP_NUM_THREADS -np 1 $(MPI_MESH_TEST)
	OMP_NUM_THREADS=1 $(MPIRUN) -x OMP_NUM_THREADS -np 2 $(MPI_MESH_TEST)
	OMP_NUM_THREADS=1 $(MPIRUN) -x OMP_NUM_THREADS -np 4 $(MPI_MESH_TEST)
	@echo "==== a rank killed before a collective (deadline 3 s)"; start=$$(date +%s); \
	  if NABLA_COLLECTIVE_TIMEOUT_S=3 $(MPIRUN) -x NABLA_COLLECTIVE_TIMEOUT_S -np 2 \
	     $(MPI_MESH_TEST) killed > $(BUILD)/test/killed.log 2>&1; then \
	    echo "the job did not fail"; cat $(BUILD)/test/killed.log; exit 1; fi; \
	  took=$$(( $$(date +%s) - start )); grep -E "nabla|signal|exited" $(BUILD)/test/killed.log; \
	  [ $$took -lt 30 ] || { echo "took $$took s"; exit 1; }; echo "ended in $$took s"
	@echo "==== a rank that never arrives (deadline 3 s)"; start=$$(date +%s); \
	  if NABLA_COLLECTIVE_TIMEOUT_S=3 $(MPIRUN) -x NABLA_COLLECTIVE_TIMEOUT_S -np 2 \
	     $(MPI_TEST) deadline > $(BUILD)/test/deadline.log 2>&1; then \
	    echo "the job did not fail"; cat $(BUILD)/test/deadline.log; exit 1; fi; \
	  took=$$(( $$(date +%s) - start )); cat $(BUILD)/test/deadline.log | grep nabla; \
	  grep -q "no word from rank(s) 1" $(BUILD)/test/deadline.log || { echo "no report"; exit 1; }; \
	  [ $$took -lt 30 ] || { echo "took $$took s"; exit 1; }; echo "ended in $$took s"

ifeq ($(TSAN),1)
test: deps
	@$(MAKE) --no-print-directory $(THREAD_TEST)
	OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:exitcode=66 $(THREAD_TEST)
else
test: deps
	@sh scripts/check_layers.sh
	@$(MAKE) --no-print-directory $(TEST_BIN)
	$(TEST_BIN) --jobs 2 $(TEST_ARGS)
	@if [ -z "$(TEST_ARGS)" ]; then echo "==== the suite on emu:0"; \
	  NABLA_TEST_DEVICE=emu:0 $(TEST_BIN) --jobs 2 --filter '!($(EMU_SKIP))/*'; fi
	@if [ -z "$(TEST_ARGS)" ]; then for isa in $(ISA_PASSES); do \
	  echo "==== the numeric suites with NABLA_ISA=$$isa"; \
	  NABLA_ISA=$$isa $(TEST_BIN) --jobs 2 --filter '@($(ISA_SUITES))/*' || exit 1; done; fi
	@if [ -z "$(TEST_ARGS)" ]; then echo "==== the numeric suites with f32 GEMMs on OpenBLAS (the AVX2 path)"; \
	  NABLA_SGEMM=openblas $(TEST_BIN) --jobs 2 --filter '@($(ISA_SUITES)|linalg|threads|optim|char_gpt)/*'; fi
endif

# make CUDA=1 test-cuda-host: the CUDA backend's host-side tests alone (no GPU, and
# only the parts of the library they use: NVRTC, kernel caches, allocator, loader).
CUDA_HOST_TEST := $(BUILD)/test/cuda_host_tests
$(CUDA_HOST_TEST): test/test_cuda_host.c test/common.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itest $< -o $@ $(LIB_A) $(LDFLAGS_ALL) -lcriterion $(LIBS)

test-cuda-host: deps
	@$(MAKE) --no-print-directory $(CUDA_HOST_TEST)
	$(CUDA_HOST_TEST) --jobs 2 $(TEST_ARGS)

# make CUDA=1 test-cuda-fake: the CUDA suites on the fake CUDA stack (test/fake_cuda/README.md:
# driver, NVRTC and cuBLASLt in one library; kernels compiled for the host, cached in
# $(FAKE_CUDA_DIR)), so they run where no GPU is. FAKE_ARGS replaces the suite filter.
FAKE_CUDA_LIB := $(BUILD)/test/libnbfakecuda.so
FAKE_CUDA_DIR ?= $(abspath $(BUILD))/fake-cuda-kernels
FAKE_ARGS ?= --filter '@(cuda|cuda_ops|cuda_gemm|cuda_train|cuda_gpu)/*'
$(FAKE_CUDA_LIB): $(wildcard test/fake_cuda/*.c test/fake_cuda/*.h) test/cuda_host_shim.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fvisibility=hidden -DNB_FAKE_SHIM='"$(abspath test/cuda_host_shim.h)"' \
	  -shared -o $@ $(filter %.c,$^) $(LDFLAGS_ALL) -ldl -lpthread -lm

.PHONY: test-cuda-fake
test-cuda-fake: deps
	@$(MAKE) --no-print-directory $(TEST_BIN) $(FAKE_CUDA_LIB)
	@tmp=$$(mktemp -d) && lib=$(abspath $(FAKE_CUDA_LIB)) && \
	  NABLA_CUDA_DRIVER=$$lib NABLA_CUDA_NVRTC=$$lib NABLA_CUDA_CUBLASLT=$$lib \
	  NABLA_CACHE_DIR=$$tmp NABLA_FAKE_CUDA_DIR=$(FAKE_CUDA_DIR) \
	  $(TEST_BIN) --jobs 2 $(FAKE_ARGS) $(TEST_ARGS); rc=$$?; rm -rf $$tmp; exit $$rc

# make test-allocfail: the allocation-failure sweep (test/allocfail/allocfail.c), under
# AddressSanitizer + LeakSanitizer (build-san/): the library's allocations go through
# the driver's wrappers (-Wl,--wrap), which fail the Nth one; every N over a training
# step in each style. ALLOCFAIL_ARGS: styles, --from N, --only N, --verbose.
ALLOCFAIL_BIN := $(BUILD)/test/allocfail
ALLOCFAIL_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=free \
  -Wl,--wrap=posix_memalign,--wrap=strdup
$(ALLOCFAIL_BIN): test/allocfail/allocfail.c $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(ALLOCFAIL_WRAP) $(LIBS) -lpthread

.PHONY: test-allocfail run-allocfail
test-allocfail: deps
	@$(MAKE) --no-print-directory SAN=1 run-allocfail
run-allocfail: $(ALLOCFAIL_BIN)
	$(ALLOCFAIL_BIN) $(ALLOCFAIL_ARGS)

# make fuzz: the libFuzzer target test/fuzz/ (test/fuzz/README.md) built with clang in
# build-fuzz/ and run for FUZZ_SECS seconds on the committed seed corpus
# (test/fuzz/corpus/, read only) plus build-fuzz/fuzz/corpus/ (what it finds is kept
# there); crashes go to build-fuzz/fuzz/artifacts/. make fuzz-ci: the same from an
# empty scratch corpus, its final statistics printed; any crash, leak or timeout fails.
FUZZ_SECS ?= 180
FUZZ_BIN := $(BUILD)/fuzz/fuzz_api
FUZZ_SRCS := $(sort $(wildcard test/fuzz/*.c))
# a huge creation must reach the library's NB_ERR_OOM path, not libFuzzer's malloc limit
FUZZ_FLAGS := -timeout=60 -rss_limit_mb=3072 -malloc_limit_mb=1000000000 \
  -dict=test/fuzz/fuzz_api.dict -artifact_prefix=$(BUILD)/fuzz/artifacts/
$(FUZZ_BIN): $(FUZZ_SRCS) test/fuzz/fuzz.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer $(FUZZ_SRCS) -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS) -lpthread

.PHONY: fuzz fuzz-ci fuzz-run fuzz-ci-run
fuzz: deps
	@$(MAKE) --no-print-directory FUZZ=1 CC=clang fuzz-run
fuzz-ci: deps
	@$(MAKE) --no-print-directory FUZZ=1 CC=clang fuzz-ci-run
fuzz-run: $(FUZZ_BIN)
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/artifacts
	$(FUZZ_BIN) $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECS) $(BUILD)/fuzz/corpus test/fuzz/corpus
fuzz-ci-run: $(FUZZ_BIN)
	@rm -rf $(BUILD)/fuzz/ci-corpus && mkdir -p $(BUILD)/fuzz/ci-corpus $(BUILD)/fuzz/artifacts
	$(FUZZ_BIN) $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECS) -print_final_stats=1 \
	  $(BUILD)/fuzz/ci-corpus test/fuzz/corpus

$(BUILD)/examples/%: examples/%.c $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

demo: deps
	@$(MAKE) --no-print-directory all $(EXAMPLES)
	@for e in $(EXAMPLES); do echo "==== $$e"; a=""; \
	  case $$e in */digits) a=$$(sh scripts/deps.sh digits $(BUILD)/data) || exit 1;; esac; \
	  $$e $$a || exit 1; done

$(BUILD)/bench/%: bench/%.c bench/bench_common.h bench/autoshard_step.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

# Runs every C bench and, when bench/peers/.venv exists (bench/peers/setup.sh makes
# it), the PyTorch and JAX scripts, collecting their JSON lines in
# $(BUILD)/bench/results.jsonl; then bench/report.py prints nabla vs the peers.
PEERS_PY := bench/peers/.venv/bin/python
# Debian's OpenBLAS 0.3.21 misdetects AVX-512 Xeon guests (it falls back to Haswell
# kernels); it is told SkylakeX only where the CPU has avx512f, never forced: on an AVX2
# machine (AMD EPYC Zen 3) those kernels die with "Illegal instruction".
OPENBLAS_ENV := $(shell grep -q -m1 -w avx512f /proc/cpuinfo 2>/dev/null && echo OPENBLAS_CORETYPE=SkylakeX)
bench: deps
	@$(MAKE) --no-print-directory $(BENCHES)
	@out=$(BUILD)/bench/results.jsonl; log=$(BUILD)/bench/last.txt; : > $$out; \
	for b in $(BENCHES); do \
	  $(OPENBLAS_ENV) $$b > $$log || { cat $$log; exit 1; }; \
	  cat $$log; cat $$log >> $$out; \
	done; \
	if [ -x $(PEERS_PY) ]; then \
	  for s in torch_bench jax_bench; do \
	    $(OPENBLAS_ENV) $(PEERS_PY) bench/peers/$$s.py > $$log || { cat $$log; exit 1; }; \
	    cat $$log; cat $$log >> $$out; \
	  done; \
	  $(PEERS_PY) bench/report.py $$out; \
	else echo "bench: no bench/peers/.venv (run bench/peers/setup.sh): PyTorch and JAX skipped"; fi

# The char-level GPT's training step (bench/bench_gpt.c, bench/peers/torch_gpt.py), nabla
# and PyTorch on 1 and 2 threads in one run; JSON lines, then steps/s side by side.
bench-gpt: deps
	@$(MAKE) --no-print-directory $(BUILD)/bench/bench_gpt
	@$(OPENBLAS_ENV) $(BUILD)/bench/bench_gpt | tee $(BUILD)/bench/gpt.jsonl
	@if [ -x $(PEERS_PY) ]; then \
	  $(OPENBLAS_ENV) $(PEERS_PY) bench/peers/torch_gpt.py | tee -a $(BUILD)/bench/gpt.jsonl; \
	  $(PEERS_PY) -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
	    [print("%d thread(s): nabla %.2f ms, pytorch %.2f ms per step (pytorch / nabla %.2f)" % \
	      (t, 1e3*n["median_s"], 1e3*p["median_s"], p["median_s"]/n["median_s"])) \
	     for t in (1, 2) for n in r if n["impl"]=="nabla" and n["threads"]==t \
	     for p in r if p["impl"]=="pytorch" and p["threads"]==t]' $(BUILD)/bench/gpt.jsonl; \
	else echo "bench-gpt: no bench/peers/.venv (run bench/peers/setup.sh): PyTorch skipped"; fi

# The MLP-784 step quiet and beside `nproc` CPU-bound processes, with PyTorch's
# (bench/loaded.sh).
bench-loaded: deps
	@$(MAKE) --no-print-directory $(BUILD)/bench/bench_train
	@$(OPENBLAS_ENV) sh bench/loaded.sh $(BUILD)

# make MPI=1 bench-mpi: collectives between processes through nabla against the
# MPI primitives called directly, and the data-parallel MLP step at 1, 2 and 4
# ranks (bench/mpi/bench_mpi.c; ARGS="--max-mib 256" for the largest sizes).
MPI_BENCH := $(BUILD)/bench/bench_mpi
$(MPI_BENCH): bench/mpi/bench_mpi.c bench/bench_common.h bench/autoshard_step.h $(LIB_A)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $< -o $@ $(LIB_A) $(LDFLAGS_ALL) $(LIBS)

bench-mpi:
	@if [ "$(MPI)" != 1 ]; then echo "bench-mpi: needs make MPI=1 bench-mpi"; exit 1; fi
	@$(MAKE) --no-print-directory MPI=1 $(MPI_BENCH)
	@sh bench/mpi/run.sh $(BUILD) $(ARGS)

bench-smoke: deps
	@$(MAKE) --no-print-directory $(BENCHES)
	@for b in $(BENCHES); do $(OPENBLAS_ENV) $$b --smoke || exit 1; done

install: all
	install -d $(DESTDIR)$(PREFIX)/include/nabla $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/nabla/*.h $(DESTDIR)$(PREFIX)/include/nabla/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libnabla.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libnabla.so.$(SOVER)
	ln -sf libnabla.so.$(SOVER) $(DESTDIR)$(PREFIX)/lib/libnabla.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' nabla.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/nabla.pc

# Installs into a scratch prefix and builds the README's first example against
# it with pkg-config, as a user would.
install-check: all
	rm -rf $(BUILD)/prefix
	$(MAKE) --no-print-directory install PREFIX=$(abspath $(BUILD)/prefix)
	PKG_CONFIG_PATH=$(abspath $(BUILD)/prefix)/lib/pkgconfig; export PKG_CONFIG_PATH; \
	  $(CC) examples/first.c $$(pkg-config --cflags --libs nabla) -o $(BUILD)/first-installed
	LD_LIBRARY_PATH=$(abspath $(BUILD)/prefix)/lib $(BUILD)/first-installed

uninstall:
	rm -rf $(DESTDIR)$(PREFIX)/include/nabla
	rm -f $(DESTDIR)$(PREFIX)/lib/libnabla.* $(DESTDIR)$(PREFIX)/lib/pkgconfig/nabla.pc

# The public headers must compile as C++ too.
check-cxx:
	echo '#include <nabla/nabla.h>' | g++ -x c++ -std=c++17 -Wall -Wextra -Werror -Iinclude -fsyntax-only -

format:
	clang-format -i $(shell find include src test examples bench -name '*.[ch]')

clean:
	rm -rf build build-san build-clang build-san-clang build-fuzz
