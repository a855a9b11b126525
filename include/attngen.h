// SPDX-License-Identifier: BSD-3-Clause
/* attngen.h: the public C API of attngen.
 *
 * Two layers share this header. The generator (spec parsing, validation,
 * planning, CUDA C emission) needs only libyaml and libc and never touches
 * CUDA. The runtime adds NVRTC compilation, the on-disk cubin cache and
 * launching through the CUDA Driver API, which it loads with dlopen on first
 * use, so everything up to `ag_compile` works on a machine without a driver.
 *
 * Conventions: every function that can fail returns an `ag_status` and, when
 * given a non-NULL `ag_error *`, fills it with a printable message. Out
 * parameters come last and are named out_*. Nothing here prints or exits.
 */
#ifndef ATTNGEN_H
#define ATTNGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AG_VERSION_STRING "0.7.0"

/* Marks the functions libattngen.so exports. The library is built with
 * -fvisibility=hidden, so this header's declarations are its whole dynamic
 * interface; tests/check_exports.c holds the two lists equal. */
#if defined(__GNUC__)
#define AG_API __attribute__((visibility("default")))
#else
#define AG_API
#endif

/* ---- errors ------------------------------------------------------------ */

typedef enum ag_status {
  AG_OK = 0,
  AG_ERR_SPEC,             /* the spec is invalid (message lists every error) */
  AG_ERR_UNSUPPORTED,      /* valid spec, but its kernel does not exist yet */
  AG_ERR_IO,               /* a file could not be read or written */
  AG_ERR_NOMEM,            /* an allocation failed */
  AG_ERR_TEMPLATE,         /* a template is malformed (a bug in attngen) */
  AG_ERR_NVRTC,            /* NVRTC failed; the message carries its log */
  AG_ERR_NO_DRIVER,        /* libcuda.so.1 could not be loaded */
  AG_ERR_NO_DEVICE,        /* the driver loaded but reports no usable device */
  AG_ERR_CUDA,             /* a Driver API call failed */
  AG_ERR_INVALID_ARGUMENT, /* a run-time argument was rejected before launch */
  AG_ERR_CACHE,            /* the cache failed in a way that was not a miss */
  AG_ERR_COUNT
} ag_status;

/* The error record. `message` is NULL or a string from malloc() that the
 * record owns; ag_error_clear() frees it. A zero-initialised record is
 * empty. Spec errors are formatted "file:line:col: error: text", followed by
 * the source line and a caret, one block per error. */
typedef struct ag_error {
  ag_status code;
  char *message;
} ag_error;

/* A static, never-NULL name for a status code ("invalid spec", ...). */
AG_API const char *ag_strerror(ag_status code);
/* Frees the message and resets the record; accepts NULL. */
AG_API void ag_error_clear(ag_error *err);

/* ---- specs ------------------------------------------------------------- */

typedef enum ag_pattern { AG_PATTERN_BLOCK_DIAGONAL, AG_PATTERN_JAGGED } ag_pattern;
typedef enum ag_query { AG_QUERY_PER_SEQUENCE, AG_QUERY_BROADCAST } ag_query;
typedef enum ag_dtype { AG_DTYPE_BF16, AG_DTYPE_FP16 } ag_dtype;
typedef enum ag_rotary_layout {
  AG_ROTARY_NONE, AG_ROTARY_INTERLEAVED, AG_ROTARY_HALF
} ag_rotary_layout;
typedef enum ag_rotary_positions {
  AG_POSITIONS_TABLE, AG_POSITIONS_SEQUENCE, AG_POSITIONS_BLOCK
} ag_rotary_positions;
typedef enum ag_arch { AG_ARCH_AUTO, AG_ARCH_SM80, AG_ARCH_SM90A } ag_arch;

enum { AG_APPLY_Q = 1u, AG_APPLY_K = 2u, AG_APPLY_V = 4u };
enum { AG_PASS_FORWARD = 1u, AG_PASS_BACKWARD = 2u };

/* Where a key was written in the spec, 1-based; line 0 means absent. */
typedef struct ag_pos { int line, col; } ag_pos;

#define AG_NAME_MAX 64
#define AG_SOURCE_MAX 256

/* A parsed, validated spec. Plain data: copy it freely. */
typedef struct ag_spec {
  char source[AG_SOURCE_MAX]; /* basename of the spec file, or "<string>" */
  char name[AG_NAME_MAX];     /* [a-z][a-z0-9_]* */
  ag_pattern pattern;
  int block_size;             /* block_diagonal: 16..256, multiple of 16 */
  bool causal;
  bool has_window;            /* jagged: window present */
  int window_left, window_right;
  ag_query query;
  int head_dim;               /* 64 | 128 */
  ag_dtype dtype;
  double softmax_scale;       /* 0 means auto: 1/sqrt(head_dim) */
  struct {
    ag_rotary_layout layout;  /* AG_ROTARY_NONE when absent */
    unsigned apply_to;        /* AG_APPLY_* bits */
    ag_rotary_positions positions;
    double base;
  } rotary;
  unsigned passes;            /* AG_PASS_* bits */
  ag_arch arch;
  bool deterministic;         /* jagged: the backward is bit-identical across runs */
  bool row_strides;           /* block_diagonal: the kernels take each tensor's row
                                 stride and kv_heads (views, grouped-query heads) */
  struct {                    /* source positions, for later diagnostics */
    ag_pos name, pattern, block_size, causal, window, query, head_dim, dtype,
        softmax_scale, rotary, passes, arch, deterministic, row_strides;
  } at;
} ag_spec;

/* Parse and validate a spec. Every error found is reported, not just the
 * first. Returns AG_OK, AG_ERR_SPEC, AG_ERR_UNSUPPORTED (valid, but names a
 * kernel attngen cannot build yet or a shape its kernels do not take, such
 * as the backward of blocks too large for shared memory: a spec loaded with
 * AG_OK always plans and emits), AG_ERR_IO or AG_ERR_NOMEM. On AG_OK and
 * AG_ERR_UNSUPPORTED *out_spec is filled in full (an unsupported spec can
 * still be inspected); otherwise it is zeroed. On AG_OK err is cleared.
 * out_spec and err may be NULL. Thread-safe; allocates nothing that outlives
 * the call. */
AG_API ag_status ag_spec_load_file(const char *path, ag_spec *out_spec, ag_error *err);
/* As above from memory; `source_name` names it in messages (NULL:
 * "<string>"). */
AG_API ag_status ag_spec_load_string(const char *yaml, size_t len, const char *source_name,
                                     ag_spec *out_spec, ag_error *err);

/* The effective softmax scale (resolves auto); 0 for a NULL spec or one
 * without a head_dim. */
AG_API double ag_spec_scale(const ag_spec *spec);

/* ---- generation -------------------------------------------------------- */

/* Emit the specialized CUDA C for a spec. A NULL spec or out_source, or a
 * hand-filled spec with a field out of range (an enum, the name, head_dim,
 * ...), is AG_ERR_INVALID_ARGUMENT, as for ag_compile and ag_kernel_get. *out_source is a NUL-terminated
 * string from malloc(); the caller frees it with free(). Deterministic: the
 * same spec gives the same bytes. The kernel's entry name is written to
 * out_kernel_name (at least AG_KERNEL_NAME_MAX bytes) when non-NULL; a spec
 * with both passes gets one source holding the forward kernel (the name
 * reported, ending _fwd) and then the backward (the same name ending
 * _bwd). */
#define AG_KERNEL_NAME_MAX 128
AG_API ag_status ag_emit(const ag_spec *spec, char **out_source, char *out_kernel_name,
                         ag_error *err);

/* ---- compilation (NVRTC; no driver needed) ----------------------------- */

/* The library's version, AG_VERSION_STRING as it was built: a program (or
 * a binding that mirrors this header's structs) compares it with the
 * header it was compiled against. */
AG_API const char *ag_version(void);

/* "sm_90a" or "sm_80" for a spec arch; AG_ARCH_AUTO gives NULL. */
AG_API const char *ag_arch_name(ag_arch arch);
/* The one rule for a target arch a user names (the spec's `arch:` key and
 * the CLI's --arch): "sm_80" (runs on every 8.x GPU: sm_86, sm_89 too) or
 * "sm_90a" (9.0: H100, H200), the two code paths attngen's kernels are
 * written for; `allow_auto` also takes "auto" (AG_ARCH_AUTO). Anything else
 * is AG_ERR_INVALID_ARGUMENT with a one-line message. out_arch may be NULL.
 * (On its own device the runtime compiles an auto spec for that device's
 * arch, sm_86 say, with sm_80's code.) Thread-safe. */
AG_API ag_status ag_arch_parse(const char *name, bool allow_auto, ag_arch *out_arch,
                               ag_error *err);

/* Compile a spec to a cubin for `arch` ("sm_90a", "sm_80", ...), through the
 * on-disk cache (ATTNGEN_CACHE_DIR, ATTNGEN_CACHE_DISABLE). *out_cubin is
 * from malloc(); the caller frees it. Thread-safe. May take seconds. */
AG_API ag_status ag_compile(const ag_spec *spec, const char *arch, void **out_cubin,
                            size_t *out_size, ag_error *err);

/* ---- runtime (Driver API) ---------------------------------------------- */

typedef struct ag_context ag_context; /* one per device */
typedef struct ag_kernel ag_kernel;   /* owned by its context */
struct CUstream_st;                   /* CUstream from cuda.h */

/* Create a context on a device: loads libcuda.so.1 on first use, retains the
 * device's primary context. Thread-safe. */
AG_API ag_status ag_context_create(int device_ordinal, ag_context **out_ctx, ag_error *err);
/* Unloads every kernel and releases the primary context; accepts NULL. No
 * launch on this context may be in flight or start during the call. */
AG_API void ag_context_destroy(ag_context *ctx);
/* The device's arch name ("sm_90a" for compute capability 9.0). */
AG_API const char *ag_context_arch(const ag_context *ctx);

/* Get the kernel for a spec: from the context's memory cache, else the disk
 * cache, else NVRTC. The kernel lives as long as the context. Thread-safe;
 * may compile (seconds) on a miss. */
AG_API ag_status ag_kernel_get(ag_context *ctx, const ag_spec *spec, ag_kernel **out_kernel,
                               ag_error *err);
/* The same from a spec file or YAML text: parse and validate (errors as
 * ag_spec_load_*), then ag_kernel_get. */
AG_API ag_status ag_kernel_get_file(ag_context *ctx, const char *path, ag_kernel **out_kernel,
                                    ag_error *err);
AG_API ag_status ag_kernel_get_string(ag_context *ctx, const char *yaml, size_t len,
                                      ag_kernel **out_kernel, ag_error *err);
AG_API const ag_spec *ag_kernel_spec(const ag_kernel *kernel);
/* Whether a block-diagonal kernel's launches take row strides other than
 * the packed heads * head_dim (ag_block_fwd_args.q_stride and the rest):
 * its spec says `row_strides: true`. False for other patterns. */
AG_API bool ag_kernel_takes_row_strides(const ag_kernel *kernel);
/* Whether the kernel's launches take fewer key heads than query heads:
 * always for the jagged pattern (kv_heads in its argument structs); for the
 * block-diagonal one where its spec says `row_strides: true` (its kernels
 * then read the key heads in place, ag_block_fwd_args.kv_heads). False for
 * NULL. */
AG_API bool ag_kernel_takes_kv_heads(const ag_kernel *kernel);

/* A prebuilt cubin of a spec's kernels for one arch ("sm_80", "sm_90a"),
 * as `attngen build` embeds them. */
typedef struct ag_image {
  const char *arch;
  const void *cubin;
  size_t size;
} ag_image;
/* The kernel for a spec from prebuilt images, with no compile: the image
 * of the device's arch (else one that runs on it) is loaded with the plan
 * the spec gives, so launches go through the same checks and launchers as
 * a JIT kernel's. The images must have been built from this spec (`attngen
 * build` writes both into one file). AG_ERR_INVALID_ARGUMENT when no image
 * runs on the device. Thread-safe; the kernel lives as long as the
 * context. */
AG_API ag_status ag_kernel_from_images(ag_context *ctx, const ag_spec *spec,
                                       const ag_image *images, int nimages,
                                       ag_kernel **out_kernel, ag_error *err);

/* Block-diagonal forward. Tensors are [total_tokens, heads, head_dim] (k
 * and v: kv_heads, below) of the spec's dtype, 16-byte aligned, on the
 * context's device, packed unless row strides are given (below);
 * offsets is int32 [batch+1] on the device with offsets[0] = 0,
 * non-decreasing, offsets[batch] = total_tokens. Arguments are checked on the
 * host before launch (no synchronization); the launch is asynchronous on
 * `stream` (NULL: the legacy default stream). Thread-safe. */
typedef struct ag_block_fwd_args {
  const void *q, *k, *v; /* CUdeviceptr values */
  void *o;
  const int32_t *offsets;
  int64_t batch;
  int64_t heads;
  int64_t total_tokens;
  /* Optional: NULL, or a host copy of offsets (int32 [batch+1]). When
   * non-NULL it is validated before the launch: host_offsets[0] == 0,
   * non-decreasing, host_offsets[batch] == total_tokens, at O(batch) host
   * cost and with no synchronization (the device copy is never read on the
   * host). Without it, malformed device offsets cannot make the kernel
   * access memory out of bounds (it clamps them), but its output is then
   * undefined. Zero-initialising the struct leaves it NULL. */
  const int32_t *host_offsets;
  /* Rotary embeddings with `positions: table` only (else NULL): the
   * per-token table [total_tokens, head_dim] on the device, sin in columns
   * [0, head_dim/2) and cos in [head_dim/2, head_dim), in the spec's dtype. */
  const void *rotary_table;
  /* Optional row strides: elements from one token's row of a tensor to the
   * next token's; 0 (a zeroed struct) means the packed layout, heads *
   * head_dim (kv_heads * head_dim for k and v). A row's heads stay
   * contiguous (head h at h * head_dim). Each stride is a multiple of 8
   * (16 bytes), at least the packed one and below 2^31, so
   * q, k and v may be column slices of one projection output [tokens, 3 *
   * heads * head_dim] with no copy. Kernels whose spec does not say
   * `row_strides: true` (ag_kernel_takes_row_strides) refuse any other than
   * the packed one with AG_ERR_UNSUPPORTED. */
  int64_t q_stride, k_stride, v_stride, o_stride;
  /* Optional grouped-query heads: k and v have kv_heads heads, which
   * divides heads; query head h reads key head h / (heads / kv_heads). 0 (a
   * zeroed struct) means heads. k's and v's packed row is then kv_heads *
   * head_dim elements (their strides' least value). Kernels whose spec does
   * not say `row_strides: true` (ag_kernel_takes_kv_heads) refuse any other
   * than heads with AG_ERR_UNSUPPORTED. */
  int64_t kv_heads;
} ag_block_fwd_args;
AG_API ag_status ag_block_forward(ag_kernel *kernel, const ag_block_fwd_args *args,
                                  struct CUstream_st *stream, ag_error *err);

/* Block-diagonal backward: dq, dk, dv (dL/dQ, dL/dK, dL/dV) from q, k, v and
 * dout = dL/dO, with the softmax recomputed from q and k (no O and no
 * logsumexp from the forward are needed). Every element of dq, dk, dv for
 * the tokens of offsets is overwritten, not accumulated into. Tensors,
 * offsets, checks and the launch are as for ag_block_forward; the kernel's
 * spec must include the backward pass (`passes: [forward, backward]`, or
 * `[backward]` alone). Thread-safe. */
typedef struct ag_block_bwd_args {
  const void *q, *k, *v, *dout; /* CUdeviceptr values */
  void *dq, *dk, *dv;
  const int32_t *offsets;
  int64_t batch;
  int64_t heads;
  int64_t total_tokens;
  const int32_t *host_offsets; /* optional, as in ag_block_fwd_args */
  const void *rotary_table;    /* as in ag_block_fwd_args */
  /* Optional row strides, as in ag_block_fwd_args: dq, dk and dv may be
   * column slices of one gradient buffer [tokens, 3 * heads * head_dim],
   * which a projection's backward reads with no concatenation. */
  int64_t q_stride, k_stride, v_stride, dout_stride, dq_stride, dk_stride, dv_stride;
  /* Optional grouped-query heads, as in ag_block_fwd_args. dk and dv are
   * then written per query head, [total_tokens, heads, head_dim] like dq:
   * query head h's share of the gradient of key head h / (heads /
   * kv_heads); the caller sums each key head's heads / kv_heads adjacent
   * query heads (the Python binding does). */
  int64_t kv_heads;
} ag_block_bwd_args;
AG_API ag_status ag_block_backward(ag_kernel *kernel, const ag_block_bwd_args *args,
                                   struct CUstream_st *stream, ag_error *err);

/* Jagged forward (`pattern: jagged`): each sequence b's queries, rows
 * [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q, attend to its keys, rows
 * [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v. q and o are
 * [total_q, heads, head_dim], k and v [total_k, kv_heads, head_dim], of the
 * spec's dtype, contiguous, 16-byte aligned; kv_heads divides heads (query
 * head h reads key head h / (heads / kv_heads)). lse, when non-NULL, gets
 * the natural-log softmax denominator of every query row, fp32 [heads,
 * total_q] (-inf for a row with no key; its output row is 0). With causal
 * masks and windows the diagonal is aligned at the bottom right: query i of
 * a sequence of Lq queries and Lk keys sees key j <= i + Lk - Lq. Offsets
 * are int32 [batch+1] on the device, starting at 0, non-decreasing, ending
 * at the totals; for self-attention pass the same array twice and equal
 * totals. Lengths are run-time data: no recompilation, no max_seqlen. The
 * checks and the launch are as for ag_block_forward. Thread-safe. */
typedef struct ag_jagged_fwd_args {
  const void *q, *k, *v; /* CUdeviceptr values */
  void *o;
  float *lse;            /* optional (NULL): [heads, total_q] */
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
  int64_t batch;
  int64_t heads, kv_heads; /* kv_heads 0 means heads */
  int64_t total_q, total_k;
  /* Optional host copies of the offsets, validated before the launch
   * when non-NULL (as ag_block_fwd_args.host_offsets). */
  const int32_t *host_cu_seqlens_q, *host_cu_seqlens_k;
  /* Rotary embeddings with `positions: table` only (else both NULL): the
   * queries' table [total_q, head_dim] and the keys' [total_k, head_dim]
   * on the device, sin of each pair's angle in columns [0, head_dim/2)
   * and cos in [head_dim/2, head_dim), in the spec's dtype, 16-byte
   * aligned. rotary_table_k NULL means rotary_table (self-attention: the
   * keys are the queries' tokens, total_k == total_q). */
  const void *rotary_table, *rotary_table_k;
} ag_jagged_fwd_args;
AG_API ag_status ag_jagged_forward(ag_kernel *kernel, const ag_jagged_fwd_args *args,
                            struct CUstream_st *stream, ag_error *err);

/* Jagged backward: dq [total_q, heads, head_dim], dk and dv [total_k,
 * kv_heads, head_dim] (summed over each key head's group of query heads)
 * from q, k, v, the forward's o and lse, and dout = dL/dO. Every element
 * of dq, dk, dv for real tokens is overwritten. `workspace` is 16-byte
 * aligned device scratch of ag_jagged_backward_workspace_bytes(kernel,
 * heads, total_q) bytes. With `deterministic: true`, or compiled for an
 * arch before sm_90, two kernels with no atomics give bit-identical
 * results run after run. Otherwise, on sm_90a, a key-stationary wgmma
 * kernel adds dQ tile by tile to an fp32 accumulator in the workspace
 * (faster; dQ's last bits vary with the order of the additions; dK and
 * dV stay bit-identical). The spec must include the backward pass.
 * Thread-safe. */
typedef struct ag_jagged_bwd_args {
  const void *q, *k, *v, *o, *dout; /* CUdeviceptr values */
  const float *lse;                  /* the forward's, [heads, total_q] */
  void *dq, *dk, *dv;
  float *workspace;
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
  int64_t batch;
  int64_t heads, kv_heads;
  int64_t total_q, total_k;
  const int32_t *host_cu_seqlens_q, *host_cu_seqlens_k;
  const void *rotary_table, *rotary_table_k; /* as in ag_jagged_fwd_args */
} ag_jagged_bwd_args;
/* Bytes of workspace ag_jagged_backward needs with `kernel` (a jagged
 * spec's with the backward; 0 for any other kernel or a negative size):
 * 4 * heads * total_q for the deterministic kernels, and the fp32 dQ
 * accumulator, 4 * heads * total_q * head_dim, more for the fast one
 * (and 16 bytes more where a persistent wgmma kernel may run, whatever
 * the run's lengths: a counter of the tiles taken, which the pass zeroes
 * itself). */
AG_API size_t ag_jagged_backward_workspace_bytes(const ag_kernel *kernel, int64_t heads,
                                                 int64_t total_q);
AG_API ag_status ag_jagged_backward(ag_kernel *kernel, const ag_jagged_bwd_args *args,
                             struct CUstream_st *stream, ag_error *err);

/* Broadcast-Q forward (`pattern: jagged`, `query: broadcast`): one dense
 * q [n_q, heads, head_dim] is shared by every sequence: sequence b's n_q
 * queries attend to its keys, rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of
 * k and v [total_k, kv_heads, head_dim]. o is [batch * n_q, heads,
 * head_dim], sequence b's rows at b * n_q; lse, when non-NULL, fp32
 * [heads, batch * n_q]. A sequence with no key gives zero output rows and
 * lse -inf. Masks are aligned at the bottom right as in ag_jagged_forward,
 * with Lq = n_q: query i of sequence b sits at key position i + Lk - n_q
 * (the n_q queries stand for the last n_q positions of the sequence). The
 * checks and the launch are as for ag_jagged_forward. Thread-safe.
 * Rotary embeddings: key j of a sequence is rotated at position j, as in
 * ag_jagged_forward; query row i of the shared q at the fixed position i,
 * the same in every sequence (not the mask's i + Lk - n_q: a rotation that
 * moved with each sequence would make q, and dq's sum, per sequence). */
typedef struct ag_broadcast_fwd_args {
  const void *q, *k, *v; /* CUdeviceptr values */
  void *o;
  float *lse;            /* optional (NULL): [heads, batch * n_q] */
  const int32_t *cu_seqlens_k;
  int64_t batch;
  int64_t n_q;
  int64_t heads, kv_heads; /* kv_heads 0 means heads */
  int64_t total_k;
  const int32_t *host_cu_seqlens_k; /* optional host copy, validated when given */
  /* Rotary embeddings with `positions: table` only (else both NULL), as in
   * ag_jagged_fwd_args: the queries' table [n_q, head_dim] (row i rotates
   * query row i in every sequence; read, and required, only when q is
   * rotated) and the keys' [total_k, head_dim] (only when k or v is); a
   * table that is not read is ignored. */
  const void *rotary_table, *rotary_table_k;
} ag_broadcast_fwd_args;
AG_API ag_status ag_broadcast_forward(ag_kernel *kernel, const ag_broadcast_fwd_args *args,
                                      struct CUstream_st *stream, ag_error *err);

/* Broadcast-Q backward: dq [n_q, heads, head_dim] is the sum over the
 * batch of every sequence's dQ; dk and dv [total_k, kv_heads, head_dim]
 * per sequence (summed over each key head's group). o, lse and dout are
 * the forward's shapes. `workspace` is device scratch of
 * ag_broadcast_backward_workspace_bytes. dQ is summed in registers over
 * slabs of consecutive sequences and the slabs' fp32 partials are added in
 * a fixed order, so every result is bit-identical from run to run
 * whatever the spec's `deterministic` says (the staged sum is also the
 * fast one). Three kernels; the spec must include the backward pass.
 * Thread-safe. */
typedef struct ag_broadcast_bwd_args {
  const void *q, *k, *v, *o, *dout; /* CUdeviceptr values */
  const float *lse;                  /* the forward's, [heads, batch * n_q] */
  void *dq, *dk, *dv;
  float *workspace;
  const int32_t *cu_seqlens_k;
  int64_t batch;
  int64_t n_q;
  int64_t heads, kv_heads;
  int64_t total_k;
  const int32_t *host_cu_seqlens_k;
  const void *rotary_table, *rotary_table_k; /* as in ag_broadcast_fwd_args */
} ag_broadcast_bwd_args;
/* Bytes of workspace ag_broadcast_backward needs with `kernel` (a
 * broadcast spec's; 0 for any other kernel or a negative size): D of
 * every output row and the per-slab dQ partials. */
AG_API size_t ag_broadcast_backward_workspace_bytes(const ag_kernel *kernel, int64_t batch,
                                                    int64_t n_q, int64_t heads);
AG_API ag_status ag_broadcast_backward(ag_kernel *kernel, const ag_broadcast_bwd_args *args,
                                       struct CUstream_st *stream, ag_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ATTNGEN_H */
