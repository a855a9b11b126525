// SPDX-License-Identifier: BSD-3-Clause
/* runtime.h: internals shared by the runtime's files, the CLI and the tests:
 * the Driver API table, the context and kernel structs, SHA-256, NVRTC, the
 * on-disk cubin cache and the environment knobs. Not part of the public API. */
#ifndef AG_RUNTIME_H
#define AG_RUNTIME_H

#include <cuda.h>
#include <nvrtc.h> /* types only: libcuda.so.1 and libnvrtc are loaded with dlopen, never linked */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attngen.h"
#include "internal.h"
#include "plan.h"

/* ---- env.c: every environment knob the runtime reads ------------------- */

#define AG_ENV_LIBCUDA "ATTNGEN_LIBCUDA"             /* path of libcuda.so.1 */
#define AG_ENV_LIBNVRTC "ATTNGEN_LIBNVRTC"           /* path of libnvrtc.so.N */
#define AG_ENV_CACHE_DIR "ATTNGEN_CACHE_DIR"         /* cubin cache directory */
#define AG_ENV_CACHE_DISABLE "ATTNGEN_CACHE_DISABLE" /* flag: skip the disk */
#define AG_ENV_DUMP_DIR "ATTNGEN_DUMP_DIR"           /* write .cu/.log per compile */
#define AG_ENV_NVRTC_VERBOSE "ATTNGEN_NVRTC_VERBOSE" /* flag: ptxas -v in the log */
#define AG_ENV_CACHE_MAX_BYTES "ATTNGEN_CACHE_MAX_BYTES" /* LRU bound; 0: none */

/* The variable's value when set and non-empty, else NULL. The pointer is
 * getenv()'s: read it before anything calls setenv(). */
const char *ag_env_str(const char *name);
/* True when the variable is set, non-empty and not "0". */
bool ag_env_flag(const char *name);

/* ---- fileio.c: directories and atomic writes ---------------------------- */

/* mkdir -p: create `path` and missing parents with `mode`; an existing
 * directory is fine. AG_ERR_IO naming the component that failed. */
ag_status ag_mkdir_p(const char *path, unsigned mode, ag_error *err);
/* Write the concatenation of `nparts` buffers to `path` atomically: a unique
 * temporary file in the same directory (O_EXCL, mode 0666 under the umask,
 * named after at most 64 bytes of the basename plus ".tmp.XXXXXXXX"), every
 * write, fsync and close checked, then rename(), which replaces whatever
 * entry `path` was (for the cache and the dump, directories attngen owns).
 * The temporary is unlinked on any failure, so readers see the old file or
 * the whole new one. AG_ERR_IO. */
ag_status ag_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                          size_t nparts, ag_error *err);
/* Write a user-named output file (`-o`): a FIFO or character device (also
 * through a symbolic link) is written into, never replaced; a regular file
 * (also through a link, which stays) is replaced atomically as above, keeping
 * its mode and, where permitted (root), its owner and group; a new file gets
 * 0666 under the umask. A directory, block device, socket or dangling link is
 * refused. AG_ERR_IO. */
ag_status ag_write_output(const char *path, const void *data, size_t len, ag_error *err);

/* ---- dl_table.c: a table of entry points filled with dlsym() ----------- */

/* x as a string after macro expansion: AG_STR_(cuMemAlloc) is
 * "cuMemAlloc_v2" (cuda.h #defines the name to the versioned symbol). */
#define AG_XSTR_(x) #x
#define AG_STR_(x) AG_XSTR_(x)
/* One entry of a struct of function pointers: the symbol dlsym() looks up
 * and the offset of the field it goes to. */
typedef struct ag_dl_symbol {
  const char *name;
  size_t offset;
} ag_dl_symbol;
/* The entry of `type`'s field fn, named after fn as macro-expanded (an
 * X-macro's argument, as the fields themselves are). */
#define AG_DL_SYMBOL(type, fn) {AG_STR_(fn), offsetof(type, fn)},
/* Each of the `count` symbols' dlsym() result from `lib` into its field of
 * *table (fields the list does not name are left as they are). NULL when
 * every symbol was found; else the first missing one's name, and `lib` is
 * closed (dlclose). */
const char *ag_dl_table_fill(void *lib, const ag_dl_symbol *symbols, size_t count, void *table);

/* ---- driver.c: libcuda.so.1 through dlopen ------------------------------ */

/* The entry points the runtime uses. cuda.h #defines many of these names to
 * versioned symbols (cuMemAlloc -> cuMemAlloc_v2, cuCtxPushCurrent ->
 * cuCtxPushCurrent_v2, cuEventElapsedTime -> cuEventElapsedTime_v2, ...);
 * the X-macro arguments are macro-expanded, so each field is named and typed
 * after the real symbol, dlsym() looks up exactly that name, and callers
 * simply write `drv->cuMemAlloc(&p, n)`. */
/* clang-format off */
#define AG_DRIVER_FUNCS(X)                                                              \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                 \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)         \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                              \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxSetCurrent) X(cuCtxSynchronize)         \
  X(cuCtxGetCurrent)                                                                    \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)                          \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute)                                           \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuLaunchKernel)                      \
  X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuPointerGetAttribute)                   \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD)                                       \
  X(cuMemsetD8) X(cuMemsetD16) X(cuMemsetD32)                                           \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                           \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)             \
  X(cuEventElapsedTime)
/* clang-format on */

#define AG_DRIVER_FIELD_(fn) __typeof__(fn) *fn;
/* Filled once, then read-only for the life of the process. */
typedef struct ag_driver {
  AG_DRIVER_FUNCS(AG_DRIVER_FIELD_)
  /* Optional (NULL where the driver lacks it, before CUDA 12): only the
   * kernels that load by TMA need it, and their launch says so. */
  __typeof__(cuTensorMapEncodeTiled) *cuTensorMapEncodeTiled;
  int version; /* cuDriverGetVersion: 13000 for CUDA 13.0 */
} ag_driver;

/* Load libcuda.so.1 (or $ATTNGEN_LIBCUDA) and call cuInit(0), once per
 * process (pthread_once); later calls return the same outcome.
 * AG_ERR_NO_DRIVER (with dlerror()'s text, a missing symbol or cuInit's
 * error), AG_ERR_NO_DEVICE when cuInit reports no device. The table is never
 * freed; the library stays loaded. Thread-safe. */
ag_status ag_driver_get(const ag_driver **out_driver, ag_error *err);
/* AG_OK when r is CUDA_SUCCESS, else AG_ERR_CUDA with
 * "WHAT failed: CUDA_ERROR_X: description". Thread-safe. */
ag_status ag_cuda_check(ag_error *err, CUresult r, const char *what);
/* The dlsym() names of the table's entries, in AG_DRIVER_FUNCS order, for
 * tests and diagnostics; *out_count receives their number. */
const char *const *ag_driver_symbols(size_t *out_count);

/* ---- sha256.c: SHA-256 (FIPS 180-4) ------------------------------------- */

#define AG_SHA256_BYTES 32
typedef struct ag_sha256 {
  uint32_t h[8];
  uint64_t total; /* bytes hashed so far */
  uint8_t block[64];
  size_t fill; /* bytes waiting in block */
} ag_sha256;

void ag_sha256_init(ag_sha256 *s);
void ag_sha256_update(ag_sha256 *s, const void *data, size_t len);
/* Writes the digest; the state must be re-initialised before reuse. */
void ag_sha256_final(ag_sha256 *s, uint8_t out[AG_SHA256_BYTES]);
/* One-shot digest. */
void ag_sha256_digest(const void *data, size_t len, uint8_t out[AG_SHA256_BYTES]);
/* Lower-case hex of a digest, NUL-terminated (65 bytes). */
void ag_sha256_hex(const uint8_t digest[AG_SHA256_BYTES], char out[2 * AG_SHA256_BYTES + 1]);

/* ---- arch.c: target arch names ------------------------------------------ */

#define AG_ARCH_NAME_MAX 16
/* AG_OK for "sm_NN" or "sm_NNa" (two or three digits, e.g. sm_80, sm_86,
 * sm_90a, sm_100a) from sm_80 on, else AG_ERR_INVALID_ARGUMENT in one line.
 * The runtime's own rule (a device's arch, ag_compile); what a user names in
 * a spec or on the command line is ag_arch_parse's narrower one. */
ag_status ag_arch_check(const char *arch, ag_error *err);
/* The arch to compile for on a device: "sm_90a" for 9.0, else
 * "sm_<major><minor>". */
void ag_arch_for_device(int major, int minor, char out[AG_ARCH_NAME_MAX]);
/* Whether a cubin built for `arch` runs on a device of compute capability
 * major.minor: same major and a minor no greater than the device's; an
 * arch-specific ("a") cubin only on its exact device. False if malformed. */
bool ag_arch_runs_on(const char *arch, int major, int minor);
/* Whether `arch` ("sm_86", ...) is well-formed and older than sm_90: no
 * wgmma, no bulk copies, so sm_80's code is what runs there. */
bool ag_arch_before_sm90(const char *arch);

/* ---- nvrtc.c: CUDA C -> cubin ------------------------------------------- */

#define AG_NVRTC_MAX_OPTIONS 4
#define AG_NVRTC_OPTION_MAX 48
/* The compile options, sorted with strcmp, as plain data (copy freely). */
typedef struct ag_nvrtc_options {
  size_t count;
  char opt[AG_NVRTC_MAX_OPTIONS][AG_NVRTC_OPTION_MAX];
} ag_nvrtc_options;

/* ---- nvrtc_lib.c: NVRTC through dlopen, on the first compile ------------- */
#define AG_NVRTC_FUNCS(X)                                                                  \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcCompileProgram)      \
  X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)    \
  X(nvrtcDestroyProgram)
typedef struct ag_nvrtc_table {
#define AG_NVRTC_FIELD_(fn) __typeof__(&fn) fn;
  AG_NVRTC_FUNCS(AG_NVRTC_FIELD_)
#undef AG_NVRTC_FIELD_
} ag_nvrtc_table;
/* The loaded table (once per process; thread-safe), or AG_ERR_NVRTC saying
 * which library could not be loaded and how to name another. */
ag_status ag_nvrtc_lib(const ag_nvrtc_table **out, ag_error *err);
/* Whether this process has loaded NVRTC (for tests: a cache hit must not). */
bool ag_nvrtc_lib_loaded(void);

/* The options ag_nvrtc_compile passes for `arch` (checked as above):
 * --gpu-architecture=<arch> (a real arch, so NVRTC emits a cubin, never
 * PTX), -std=c++17, and --ptxas-options=-v when ATTNGEN_NVRTC_VERBOSE is set.
 * They are part of the cache key. */
ag_status ag_nvrtc_options_make(const char *arch, ag_nvrtc_options *out, ag_error *err);
/* NVRTC's version (13.0 for CUDA 13.0). AG_ERR_NVRTC on failure. */
ag_status ag_nvrtc_version(int *out_major, int *out_minor, ag_error *err);
/* Compile `source` (no #includes needed) to a cubin for `arch`.
 * `program_name` names the program in the log ("<name>.cu") and the dump
 * files. The log is always fetched; on failure AG_ERR_NVRTC carries it.
 * With ATTNGEN_DUMP_DIR set, writes <dir>/<name>.cu and <name>.log
 * (atomically) on every compile and names them in failure messages; a dump
 * that cannot be written does not fail the compile (ag_nvrtc_compile_ex
 * returns it as a warning).
 * *out_cubin is from malloc(); the caller frees it. Thread-safe; seconds. */
ag_status ag_nvrtc_compile(const char *source, const char *program_name, const char *arch,
                           void **out_cubin, size_t *out_size, ag_error *err);
/* ag_nvrtc_compile, and when out_warning is non-NULL, *out_warning receives
 * a message from malloc() (the caller frees it) when the dump failed, else
 * NULL. */
ag_status ag_nvrtc_compile_ex(const char *source, const char *program_name, const char *arch,
                              void **out_cubin, size_t *out_size, char **out_warning,
                              ag_error *err);

/* ---- cache.c: the on-disk cubin cache ------------------------------------ */

#define AG_CACHE_FORMAT_VERSION 1u
#define AG_CACHE_MAGIC "AGCUBIN1" /* 8 bytes, no NUL in the file */
/* Header, little-endian, no padding: magic[8], format version u32, key[32],
 * payload size u64, SHA-256 of the payload[32]; then the cubin. */
#define AG_CACHE_HEADER_BYTES (8 + 4 + AG_SHA256_BYTES + 8 + AG_SHA256_BYTES)
/* An entry whose payload claims more is a miss (real cubins: under 1 MiB). */
#define AG_CACHE_MAX_ENTRY_BYTES (64u << 20)
/* The cache's size bound when ATTNGEN_CACHE_MAX_BYTES is unset or invalid. */
#define AG_CACHE_DEFAULT_MAX_BYTES ((uint64_t)1 << 30)
/* A writer's temporary file older than this is removed by ag_cache_tidy. */
#define AG_CACHE_STALE_TMP_SECONDS 600

/* Everything that determines a cubin. Each field is hashed with a length
 * prefix, so no two field lists collide by concatenation. */
typedef struct ag_cache_key_fields {
  const char *source; /* the emitted CUDA C */
  const ag_nvrtc_options *options;
  const char *arch;
  int nvrtc_major, nvrtc_minor;  /* of the toolkit attngen was built with */
  const char *generator_version; /* AG_VERSION_STRING */
  uint32_t format_version;       /* AG_CACHE_FORMAT_VERSION */
  const char *nvrtc_lib;         /* ATTNGEN_LIBNVRTC when set; NULL hashes as "" */
} ag_cache_key_fields;

void ag_cache_key(const ag_cache_key_fields *fields, uint8_t out_key[AG_SHA256_BYTES]);
/* True when ATTNGEN_CACHE_DISABLE asks to skip the disk. */
bool ag_cache_disabled(void);
/* The cache directory ($ATTNGEN_CACHE_DIR, else $XDG_CACHE_HOME/attngen,
 * else $HOME/.cache/attngen), created (mode 0700) when missing.
 * *out_dir is from malloc(). AG_ERR_CACHE saying why there is none,
 * including a directory not owned by the effective user or writable by its
 * group or others (it is then not used at all). */
ag_status ag_cache_dir(char **out_dir, ag_error *err);
/* "<dir>/<64 hex key>-<arch>-nvrtc<maj>.<min>.cubin", from malloc(). */
/* The entry of `source` compiled for `arch` as ag_compile_source keys it:
 * its key and its path in the cache directory `dir`. Needs no NVRTC: the
 * key names the toolkit attngen was built with (and ATTNGEN_LIBNVRTC when
 * set), not the library a compile would load, so a hit never loads it. */
ag_status ag_compile_cache_entry(const char *source, const char *arch, const char *dir,
                                 uint8_t out_key[AG_SHA256_BYTES], char **out_path,
                                 ag_error *err);
ag_status ag_cache_path(const char *dir, const uint8_t key[AG_SHA256_BYTES], const char *arch,
                        int nvrtc_major, int nvrtc_minor, char **out_path, ag_error *err);
/* Read and verify an entry. A missing, short, corrupt or foreign file is a
 * miss: AG_OK with *out_cubin = NULL; so are a FIFO, device or link (opened
 * O_NONBLOCK | O_NOFOLLOW, never blocking), a file owned by another user,
 * and one larger than AG_CACHE_MAX_ENTRY_BYTES plus the header (never read
 * into memory). A hit gives a malloc()ed cubin and refreshes the entry's
 * mtime (its last use). Takes no lock. */
ag_status ag_cache_load(const char *path, const uint8_t key[AG_SHA256_BYTES], void **out_cubin,
                        size_t *out_size, ag_error *err);
/* The size bound: ATTNGEN_CACHE_MAX_BYTES (decimal bytes; 0 means none),
 * else AG_CACHE_DEFAULT_MAX_BYTES. */
uint64_t ag_cache_max_bytes(void);
/* Housekeeping after a store: removes this user's temporary files older than
 * AG_CACHE_STALE_TMP_SECONDS, then, while the .cubin entries total more than
 * ag_cache_max_bytes(), the least recently used (oldest mtime) except `keep`
 * (a path in dir, or NULL). Only regular files owned by the effective user
 * are touched. Best effort, silent. */
void ag_cache_tidy(const char *dir, const char *keep);
/* Write an entry atomically (ag_write_atomic). AG_ERR_CACHE on failure;
 * nothing is left behind. */
ag_status ag_cache_store(const char *path, const uint8_t key[AG_SHA256_BYTES], const void *cubin,
                         size_t size, ag_error *err);

/* ---- compile.c: source -> cubin through the disk cache ------------------ */

typedef enum ag_cache_origin { AG_FROM_NVRTC, AG_FROM_DISK } ag_cache_origin;

/* Key -> disk lookup -> NVRTC -> store. A cache that cannot be used (no
 * directory, read-only, full disk) never fails the compile: the cubin is
 * still returned. out_origin may be NULL. *out_cubin is from malloc().
 * Thread-safe; seconds on a miss. */
ag_status ag_compile_source(const char *source, const char *name, const char *arch,
                            void **out_cubin, size_t *out_size, ag_cache_origin *out_origin,
                            ag_error *err);
/* As above; when out_warning is non-NULL it receives NULL or a malloc()ed
 * sentence saying why the disk cache was bypassed (for the CLI to print
 * once). */
ag_status ag_compile_source_ex(const char *source, const char *name, const char *arch,
                               void **out_cubin, size_t *out_size, ag_cache_origin *out_origin,
                               char **out_warning, ag_error *err);

/* ---- kernel.c: the entry points that start from a spec ------------------ */

/* ag_compile with the origin and the cache warning (both optional). */
ag_status ag_compile_spec(const ag_spec *spec, const char *arch, void **out_cubin, size_t *out_size,
                          ag_cache_origin *out_origin, char **out_warning, ag_error *err);

/* ---- launch.c, walk_*.c: one launcher for every pattern and pass -------- */

/* A pass's run-time arguments by role: what the descriptors' parameter
 * lists pick from. */
typedef struct ag_launch {
  const void *ptr[AG_PARAM_COUNT]; /* device pointers of the pointer roles */
  /* the block pattern's row strides, by tensor role (AG_PARAM_STRIDE_*) */
  int64_t stride[AG_PARAM_DV + 1];
  int64_t batch, heads, kv_heads, total_q, total_k;
  int slab_rows; /* broadcast: the query tile the slab count is sized with (ag_broadcast_slabs) */
  int variant;   /* the kernels of this variant run, and those of variant 0 (ag_plan_variant) */
} ag_launch;

/* The tensor map of a [rows, heads, head_dim] 16-bit tensor at `ptr` (a
 * row is heads * head_dim elements) in boxes of 64 elements by one head by
 * box_rows rows with the 128-byte swizzle, zeros past its end, L2 misses
 * promoted to l2_bytes (128 or 256): what the TMA roles (AG_PARAM_TMAP_*)
 * pass. AG_ERR_NO_DRIVER when the driver cannot encode one, AG_ERR_CUDA
 * when it refuses (runtime/tma.c). */
ag_status ag_tma_rows_map(const ag_driver *drv, CUtensorMap *out, const void *ptr, int64_t rows,
                          int64_t heads, int head_dim, int box_rows, int l2_bytes,
                          ag_error *err);

/* The grid of a kernel and the work count its walk takes (the ITEMS
 * parameter), from the run-time sizes alone; AG_ERR_INVALID_ARGUMENT when
 * they overflow. A grid with a zero dimension launches nothing. The block
 * walk's host half is runtime/walk_block.c, the jagged walks'
 * runtime/walk_jagged.c. */
ag_status ag_walk_block_grid(const ag_walk *w, const ag_launch *a, int sm_count, int ctas_per_sm,
                             unsigned out_grid[3], int64_t *out_items, ag_error *err);
ag_status ag_walk_jagged_grid(const ag_walk *w, const ag_launch *a, int sm_count,
                              int ctas_per_sm, unsigned out_grid[3], int64_t *out_items,
                              ag_error *err);
/* The slabs a broadcast Q's dQ is summed over (walk_jagged.c): sequences
 * are cut into this many runs of about equal work, each (query tile of
 * block_m rows, slab, head) one CTA; at most batch, 0 when nothing runs. */
int64_t ag_broadcast_slabs(int64_t batch, int64_t n_q, int64_t heads, int block_m);

/* launch_checks.c: a device pointer non-null and `align`-byte aligned
 * (16: "; the kernel loads 16 bytes at a time" in the message); the
 * optional host copy of offsets (NULL passes) starting at 0, never
 * decreasing, ending at `total` (named `total_name` in messages). */
ag_status ag_check_pointer(const void *p, const char *name, unsigned align, ag_error *err);
ag_status ag_check_host_offsets(const char *name, const char *total_name, const int32_t *off,
                                int64_t batch, int64_t total, ag_error *err);

/* Launch every kernel of `pass` in source order on `stream`, each with its
 * descriptor's parameters and its walk's grid. The pattern's entry point
 * has checked the arguments. */
ag_status ag_launch_pass(ag_kernel *kernel, unsigned pass, const ag_launch *a,
                         struct CUstream_st *stream, ag_error *err);

/* ---- schedule.c: a persistent jagged schedule, built on the host -------- */

/* The tile shape and masks the schedule counts work with. */
typedef struct ag_schedule_shape {
  int block_m, block_n;          /* query rows per item, keys per key tile */
  bool causal, window;
  int64_t window_left, window_right; /* with window; negative: unbounded side */
} ag_schedule_shape;

/* One tile of the sorted order: query tile `tile` of sequence `seq`. */
typedef struct ag_schedule_tile {
  int32_t seq, tile;
} ag_schedule_tile;

/* One work item: query tile `tile` of sequence `seq`, head `head`. */
typedef struct ag_schedule_item {
  int32_t seq, tile, head;
} ag_schedule_item;

/* The tiles sorted by key-tile work, longest first; item i is tile
 * i / heads with head i % heads, dealt to the CTAs in zigzag order
 * (ag_schedule_item_of). */
typedef struct ag_schedule {
  ag_schedule_tile *tiles;
  int32_t *work;          /* scratch: each tile's work in sequence order */
  int64_t capacity;       /* room of tiles and work */
  int64_t ntiles, nitems; /* nitems = ntiles * heads */
  int64_t heads;
  int ctas;
} ag_schedule;

/* Every (sequence, query tile) of the batch, sorted by key-tile work
 * (longest first, counting sorts; ties in no promised order), from host offsets (cu_k NULL:
 * self-attention); `ctas` CTAs will share the (tile, head) items. O(tiles)
 * time. `out` is zeroed or a previous schedule, whose buffers are reused
 * when they have room (a fresh buffer per call costs page faults); they are
 * malloc()ed and freed by ag_schedule_free. */
ag_status ag_schedule_build(const ag_schedule_shape *shape, const int32_t *cu_q,
                            const int32_t *cu_k, int64_t batch, int64_t heads, int ctas,
                            ag_schedule *out, ag_error *err);
/* How many items CTA `cta` takes, and its k-th (k below that): item
 * i = k * ctas + (k odd ? ctas - 1 - cta : cta) of the sorted order. */
int64_t ag_schedule_cta_items(const ag_schedule *s, int cta);
ag_schedule_item ag_schedule_item_of(const ag_schedule *s, int cta, int64_t k);
void ag_schedule_free(ag_schedule *s);

/* ---- context.c: devices, modules, the in-memory kernel cache ------------ */

struct ag_kernel {
  ag_context *ctx;                      /* owner */
  ag_kernel *next;                      /* the owner's list */
  uint8_t source_hash[AG_SHA256_BYTES]; /* memory-cache key, with arch */
  char arch[AG_ARCH_NAME_MAX];          /* the cubin's arch */
  ag_spec spec;                         /* arch resolved */
  ag_plan plan;
  CUmodule module;
  CUfunction fn[AG_PLAN_MAX_KERNELS]; /* plan.kernels[i].name in module */
  int ctas_per_sm[AG_PLAN_MAX_KERNELS]; /* occupancy of fn[i] at its threads, shared memory */
};

struct ag_context {
  const ag_driver *drv;
  int ordinal;
  CUdevice device;
  CUcontext cu;                /* the device's primary context, retained */
  char name[128];              /* "NVIDIA H100 80GB HBM3" */
  char arch[AG_ARCH_NAME_MAX]; /* "sm_90a" for 9.0, else "sm_<maj><min>" */
  int cc_major, cc_minor;
  int sm_count;
  int max_smem_optin;   /* dynamic shared memory a CTA may opt in to */
  pthread_mutex_t lock; /* guards kernels and cache_warning */
  ag_kernel *kernels;   /* immutable once listed; freed by destroy */
  char *cache_warning;  /* first disk-cache warning, or NULL */
};

/* A copy of `spec` specialised for `arch`, as it is planned and emitted
 * for that arch (kernel.c): what an auto spec compiled for sm_90a or sm_80
 * becomes. An explicit spec arch other than `arch` is an error. */
ag_status ag_spec_for_arch(const ag_spec *spec, const char *arch, ag_spec *out, ag_error *err);

/* The kernel for (source, arch): from the context's memory cache, else
 * `cubin` when given (a prebuilt image: no compile), else compiled through
 * the disk cache, then loaded (the compile runs without the lock; if two
 * threads race, one module is kept). `spec` and `plan` are copied into the
 * kernel; `arch` must run on the device. Thread-safe. */
ag_status ag_context_kernel(ag_context *ctx, const ag_spec *spec, const ag_plan *plan,
                            const char *source, const char *arch, const void *cubin,
                            ag_kernel **out_kernel, ag_error *err);
/* NULL or a malloc()ed copy of the first disk-cache warning seen by this
 * context; the caller frees it. Thread-safe. */
char *ag_context_cache_warning(ag_context *ctx);

#endif
