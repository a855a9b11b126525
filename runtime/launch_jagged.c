// SPDX-License-Identifier: BSD-3-Clause
/* launch_jagged.c: the jagged pattern's entry points: every argument
 * check on the host (no synchronization), then the generic launcher over
 * the plan's kernels of the pass. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"

/* A pass's tensors (in its pass_tensors' order), its offsets and sizes. */
typedef struct jagged_call {
  unsigned pass;
  const void *const *tensors;
  const int32_t *cu_q, *cu_k, *host_q, *host_k;
  int64_t batch, heads, kv_heads, total_q, total_k;
  bool broadcast; /* one dense Q of n_q rows (then total_q = batch * n_q, cu_q unused) */
  int64_t n_q;
  const void *table_q, *table_k; /* rotary tables (positions from tables) */
} jagged_call;

/* A call's offsets, sizes and rotary tables from either pass's arguments
 * (the forward's and the backward's name them alike): a jagged call's, and
 * a broadcast one's (no query offsets or total_q). */
#define JAGGED_SIZES(a)                                                                     \
  .cu_q = (a)->cu_seqlens_q, .cu_k = (a)->cu_seqlens_k, .host_q = (a)->host_cu_seqlens_q,    \
  .host_k = (a)->host_cu_seqlens_k, .batch = (a)->batch, .heads = (a)->heads,               \
  .kv_heads = (a)->kv_heads, .total_q = (a)->total_q, .total_k = (a)->total_k,              \
  .table_q = (a)->rotary_table, .table_k = (a)->rotary_table_k
#define BROADCAST_SIZES(a)                                                                  \
  .cu_k = (a)->cu_seqlens_k, .host_k = (a)->host_cu_seqlens_k, .batch = (a)->batch,         \
  .heads = (a)->heads, .kv_heads = (a)->kv_heads, .total_k = (a)->total_k,                  \
  .broadcast = true, .n_q = (a)->n_q, .table_q = (a)->rotary_table,                        \
  .table_k = (a)->rotary_table_k

#define COUNT_(array) (int)(sizeof(array) / sizeof((array)[0]))

/* The tensors of each pass by role, as the messages name them, the
 * alignment each needs (a backward's workspace may hold fp32 dQ
 * accumulators or partials, read 16 bytes at a time), and the pass's
 * arguments in that order (the jagged and broadcast structs name them
 * alike; the array lives as long as the block that writes it). */
static const ag_param fwd_roles[] = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O, AG_PARAM_LSE};
static const char *const fwd_names[] = {"q", "k", "v", "o", "lse"};
static const unsigned fwd_align[] = {16, 16, 16, 16, 4};
#define FWD_TENSORS(a) \
  (const void *const[COUNT_(fwd_roles)]){(a)->q, (a)->k, (a)->v, (a)->o, (a)->lse}
static const ag_param bwd_roles[] = {AG_PARAM_Q,  AG_PARAM_K,  AG_PARAM_V,  AG_PARAM_O,
                                     AG_PARAM_DOUT, AG_PARAM_LSE, AG_PARAM_DQ, AG_PARAM_DK,
                                     AG_PARAM_DV, AG_PARAM_DI};
static const char *const bwd_names[] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv",
                                        "workspace"};
static const unsigned bwd_align[] = {16, 16, 16, 16, 16, 4, 16, 16, 16, 16};
#define BWD_TENSORS(a)                                                                      \
  (const void *const[COUNT_(bwd_roles)]){(a)->q,   (a)->k,  (a)->v,  (a)->o,  (a)->dout,    \
                                         (a)->lse, (a)->dq, (a)->dk, (a)->dv, (a)->workspace}
_Static_assert(COUNT_(fwd_names) == COUNT_(fwd_roles) && COUNT_(fwd_align) == COUNT_(fwd_roles),
               "a name and an alignment for each forward tensor");
_Static_assert(COUNT_(bwd_names) == COUNT_(bwd_roles) && COUNT_(bwd_align) == COUNT_(bwd_roles),
               "a name and an alignment for each backward tensor");

/* A pass's tensors by role (checked in order: inputs, then outputs). */
typedef struct pass_tensors {
  int n;
  const ag_param *roles;
  const char *const *names;
  const unsigned *align;
} pass_tensors;
static const pass_tensors fwd_tensors = {COUNT_(fwd_roles), fwd_roles, fwd_names, fwd_align};
static const pass_tensors bwd_tensors = {COUNT_(bwd_roles), bwd_roles, bwd_names, bwd_align};

/* A broadcast call's tables: each one the kernel reads (the queries' [n_q,
 * head_dim] where q is rotated, the keys' where k or v is) is required,
 * never defaulted to the other (the queries are not the keys' tokens);
 * one it does not read is ignored (passed as NULL, not checked). */
static ag_status check_broadcast_tables(const ag_kernel *kernel, const jagged_call *c,
                                        ag_launch *a, ag_error *err) {
  const unsigned apply = kernel->spec.rotary.apply_to;
  const struct {
    const void *table;
    bool read;
    const char *name, *shape;
    ag_param param;
  } t[2] = {{c->table_q, apply & AG_APPLY_Q, "rotary_table", "[n_q, head_dim]",
             AG_PARAM_ROTARY_TABLE},
            {c->table_k, apply & (AG_APPLY_K | AG_APPLY_V), "rotary_table_k",
             "[total_k, head_dim]", AG_PARAM_ROTARY_TABLE_K}};
  for (int i = 0; i < 2; i++) {
    if (t[i].read && !t[i].table)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "%s is a null pointer; kernel '%s' takes its rotary positions from tables "
                     "(%s: sin, then cos)",
                     t[i].name, kernel->spec.name, t[i].shape);
    ag_status st;
    if (t[i].read && (st = ag_check_pointer(t[i].table, t[i].name, 16, err))) return st;
    a->ptr[t[i].param] = t[i].read ? t[i].table : NULL;
  }
  return AG_OK;
}

/* The rotary tables: both taken (the keys' defaulting to the queries' when
 * their tokens are the same count) by a kernel with positions from
 * tables, none by any other. */
static ag_status check_tables(const ag_kernel *kernel, const jagged_call *c, ag_launch *a,
                              ag_error *err) {
  const char *name = kernel->spec.name;
  if (!kernel->plan.takes_table) {
    if (c->table_q || c->table_k)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "a rotary table was given, but kernel '%s' takes none (%s)", name,
                     kernel->spec.rotary.layout == AG_ROTARY_NONE
                         ? "its spec has no rotary embeddings"
                         : "its spec computes the rotary positions");
    return AG_OK;
  }
  if (c->broadcast) return check_broadcast_tables(kernel, c, a, err);
  if (!c->table_q)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "rotary_table is a null pointer; kernel '%s' takes its rotary positions from "
                   "tables ([total_q, head_dim] for the queries, [total_k, head_dim] for the "
                   "keys: sin, then cos)",
                   name);
  const void *table_k = c->table_k ? c->table_k : c->table_q;
  if (!c->table_k && a->total_k != a->total_q)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "rotary_table_k is a null pointer, and the queries' table cannot serve the "
                   "keys: total_k (%lld) is not total_q (%lld)",
                   (long long)a->total_k, (long long)a->total_q);
  ag_status st;
  if ((st = ag_check_pointer(c->table_q, "rotary_table", 16, err)) ||
      (st = ag_check_pointer(table_k, "rotary_table_k", 16, err)))
    return st;
  a->ptr[AG_PARAM_ROTARY_TABLE] = c->table_q;
  a->ptr[AG_PARAM_ROTARY_TABLE_K] = table_k;
  return AG_OK;
}

/* Every check, in order, then the launch of the pass's kernels; nothing
 * is launched when there is nothing to compute. */
static ag_status launch_jagged(ag_kernel *kernel, const jagged_call *c,
                               struct CUstream_st *stream, ag_error *err) {
  const ag_spec *s = &kernel->spec;
  const bool fwd = c->pass == AG_PASS_FORWARD;
  const bool broadcast = c->broadcast;
  if (s->pattern != AG_PATTERN_JAGGED || !(s->passes & c->pass) ||
      !ag_plan_kernel_for(&kernel->plan, c->pass) ||
      broadcast != (s->query == AG_QUERY_BROADCAST))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel '%s' is not a %s %s kernel%s", s->name,
                   broadcast ? "broadcast-Q" : "jagged", fwd ? "forward" : "backward",
                   s->query == AG_QUERY_BROADCAST ? " (its spec says query: broadcast: call "
                                                    "ag_broadcast_*)"
                                                  : "");
  ag_launch a = {.batch = c->batch, .heads = c->heads,
                 .kv_heads = c->kv_heads ? c->kv_heads : c->heads, .total_q = c->total_q,
                 .total_k = c->total_k, .slab_rows = kernel->plan.jagged.bwd_block_m};
  if (broadcast) {
    if (c->n_q < 0 || c->batch < 0 || (c->batch > 0 && c->n_q > INT32_MAX / c->batch))
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "need 0 <= n_q and batch * n_q <= 2^31 - 1 (got n_q %lld, batch %lld)",
                     (long long)c->n_q, (long long)c->batch);
    a.total_q = c->batch * c->n_q;
  }
  /* the query rows of a sequence: n_q, or the mean query length */
  const int64_t rows = broadcast ? c->n_q
                       : a.batch > 0 && a.total_q > 0 ? (a.total_q + a.batch - 1) / a.batch : 0;
  a.variant = ag_plan_variant(&kernel->plan, c->pass, rows, a.heads, a.kv_heads);
  if (a.batch < 0 || a.heads < 1 || a.kv_heads < 1 || a.total_q < 0 || a.total_k < 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "need batch >= 0, heads >= 1, kv_heads >= 1, total_q >= 0, total_k >= 0 "
                   "(got %lld, %lld, %lld, %lld, %lld)",
                   (long long)a.batch, (long long)a.heads, (long long)a.kv_heads,
                   (long long)a.total_q, (long long)a.total_k);
  if (a.heads % a.kv_heads)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kv_heads (%lld) does not divide heads (%lld)",
                   (long long)a.kv_heads, (long long)a.heads);
  if (a.heads > 65535)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "heads (%lld) exceeds 65535",
                   (long long)a.heads);
  if (a.total_q > INT32_MAX || a.total_k > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "total_q and total_k (%lld, %lld) must not exceed 2^31 - 1, the most int32 "
                   "offsets can reach",
                   (long long)a.total_q, (long long)a.total_k);
  if (a.batch > INT32_MAX - 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "batch (%lld) exceeds 2^31 - 2",
                   (long long)a.batch);
  /* Bytes of the largest tensor, total * heads * head_dim * 2, fit in 64
   * bits for every size that passed (2^31 * 2^16 * 2^8). */
  ag_status st;
  if ((!broadcast && (st = ag_check_host_offsets("host_cu_seqlens_q", "total_q", c->host_q,
                                                 a.batch, a.total_q, err))) ||
      (st = ag_check_host_offsets("host_cu_seqlens_k", "total_k", c->host_k, a.batch, a.total_k,
                                   err)))
    return st;
  if (a.batch == 0 || (a.total_q == 0 && a.total_k == 0)) return AG_OK;
  const pass_tensors *t = fwd ? &fwd_tensors : &bwd_tensors;
  for (int i = 0; i < t->n; i++) {
    if (!c->tensors[i] && t->roles[i] == AG_PARAM_LSE && fwd) continue; /* optional */
    if ((st = ag_check_pointer(c->tensors[i], t->names[i], t->align[i], err))) return st;
    a.ptr[t->roles[i]] = c->tensors[i];
  }
  if ((st = check_tables(kernel, c, &a, err))) return st;
  if (!broadcast && (st = ag_check_pointer(c->cu_q, "cu_seqlens_q", 4, err))) return st;
  if ((st = ag_check_pointer(c->cu_k, "cu_seqlens_k", 4, err))) return st;
  a.ptr[AG_PARAM_OFFSETS_Q] = broadcast ? c->cu_k : c->cu_q; /* not read with broadcast */
  a.ptr[AG_PARAM_OFFSETS_K] = c->cu_k;
  return ag_launch_pass(kernel, c->pass, &a, stream, err);
}

ag_status ag_jagged_forward(ag_kernel *kernel, const ag_jagged_fwd_args *a,
                            struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const jagged_call c = {.pass = AG_PASS_FORWARD, .tensors = FWD_TENSORS(a), JAGGED_SIZES(a)};
  return launch_jagged(kernel, &c, stream, err);
}

size_t ag_jagged_backward_workspace_bytes(const ag_kernel *kernel, int64_t heads,
                                          int64_t total_q) {
  if (!kernel || kernel->spec.pattern != AG_PATTERN_JAGGED ||
      kernel->spec.query == AG_QUERY_BROADCAST || !(kernel->spec.passes & AG_PASS_BACKWARD) ||
      heads < 0 || total_q < 0)
    return 0;
  const size_t rows = (size_t)heads * (size_t)total_q;
  if (!kernel->plan.jagged.fast.block_m) return 4 * rows; /* D */
  /* D, then (16-byte aligned) the fp32 dQ accumulator, then the
   * warp-specialized _kv's tile counter (8 bytes, 16 kept; with a long
   * variant whichever variant runs), then with FUSED_DQ the tiles' add
   * counters (4 bytes a row and 64-column half) */
  const ag_plan_jagged_kv *f = &kernel->plan.jagged.fast;
  return 4 * ((rows + 3) / 4 * 4 + rows * (size_t)kernel->plan.head_dim) +
         (f->ws || kernel->plan.jagged.long_min_rows > 0 ? 16 : 0) +
         (f->fused_dq ? 4 * rows * (size_t)(kernel->plan.head_dim / 64) : 0);
}

ag_status ag_jagged_backward(ag_kernel *kernel, const ag_jagged_bwd_args *a,
                             struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const jagged_call c = {.pass = AG_PASS_BACKWARD, .tensors = BWD_TENSORS(a), JAGGED_SIZES(a)};
  return launch_jagged(kernel, &c, stream, err);
}

/* ---- broadcast queries: the jagged kernels with one dense Q ---------------- */

ag_status ag_broadcast_forward(ag_kernel *kernel, const ag_broadcast_fwd_args *a,
                               struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const jagged_call c = {.pass = AG_PASS_FORWARD, .tensors = FWD_TENSORS(a), BROADCAST_SIZES(a)};
  return launch_jagged(kernel, &c, stream, err);
}

size_t ag_broadcast_backward_workspace_bytes(const ag_kernel *kernel, int64_t batch,
                                             int64_t n_q, int64_t heads) {
  if (!kernel || kernel->spec.query != AG_QUERY_BROADCAST ||
      !(kernel->spec.passes & AG_PASS_BACKWARD) || batch < 0 || n_q < 0 || heads < 0)
    return 0;
  const int64_t rows = heads * batch * n_q;
  const int64_t slabs = ag_broadcast_slabs(batch, n_q, heads, kernel->plan.jagged.bwd_block_m);
  return 4 * ((size_t)(rows + 3) / 4 * 4 +
              (size_t)slabs * (size_t)n_q * (size_t)heads * (size_t)kernel->plan.head_dim);
}

ag_status ag_broadcast_backward(ag_kernel *kernel, const ag_broadcast_bwd_args *a,
                                struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const jagged_call c = {.pass = AG_PASS_BACKWARD, .tensors = BWD_TENSORS(a), BROADCAST_SIZES(a)};
  return launch_jagged(kernel, &c, stream, err);
}
