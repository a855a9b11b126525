// SPDX-License-Identifier: BSD-3-Clause
/* selfcheck_jagged.c: the jagged pattern's self-check (selfcheck_jagged.h):
 * device buffers through the runtime's driver table, NaN poison, the
 * launches through the public API, the float64 reference on a capped
 * sample of (sequence, head) pairs, and CUDA-event times. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fill.h"
#include "jagged_bwd_reference.h"
#include "jagged_reference.h"
#include "reference.h"
#include "runtime.h"
#include "selfcheck_jagged.h"

double ag_jagged_tolerance(ag_dtype dtype, bool backward) {
  if (backward) return dtype == AG_DTYPE_FP16 ? 5e-3 : 2e-2;
  return dtype == AG_DTYPE_FP16 ? 2e-3 : 1e-2;
}

enum { NBUF = 14 };
enum { B_Q, B_K, B_V, B_O, B_LSE, B_DO, B_DQ, B_DK, B_DV, B_WS, B_CUQ, B_CUK, B_TQ, B_TK };

typedef struct state {
  const ag_driver *drv;
  ag_context *ctx;
  CUdeviceptr d[NBUF];
  size_t bytes[NBUF];
} state;

static ag_status dev_alloc(state *s, int i, size_t bytes, ag_error *err) {
  s->bytes[i] = bytes;
  return ag_cuda_check(err, s->drv->cuMemAlloc(&s->d[i], bytes ? bytes : 16), "cuMemAlloc");
}

static ag_status upload(state *s, int i, const void *host, ag_error *err) {
  if (!s->bytes[i]) return AG_OK;
  return ag_cuda_check(err, s->drv->cuMemcpyHtoD(s->d[i], host, s->bytes[i]), "cuMemcpyHtoD");
}

static ag_status download(state *s, int i, void *host, ag_error *err) {
  if (!s->bytes[i]) return AG_OK;
  return ag_cuda_check(err, s->drv->cuMemcpyDtoH(host, s->d[i], s->bytes[i]), "cuMemcpyDtoH");
}

/* 0xffff is a NaN in bf16 and fp16; 0x7fc00000 in fp32. */
static ag_status poison(state *s, int i, bool f32, ag_error *err) {
  if (!s->bytes[i]) return AG_OK;
  return f32 ? ag_cuda_check(err, s->drv->cuMemsetD32(s->d[i], 0x7fc00000u, s->bytes[i] / 4),
                             "cuMemsetD32")
             : ag_cuda_check(err, s->drv->cuMemsetD16(s->d[i], 0xffffu, s->bytes[i] / 2),
                             "cuMemsetD16");
}

static bool is_nan16(uint16_t h, ag_dtype dt) {
  return dt == AG_DTYPE_FP16 ? (h & 0x7c00) == 0x7c00 && (h & 0x3ff)
                             : (h & 0x7f80) == 0x7f80 && (h & 0x7f);
}

/* Sum of squared differences and of squared references of one (sequence,
 * head)'s rows (at row `row0` of the kernel's tensor, `ref_row0` of the
 * reference's compact one), counting NaNs as unwritten. */
static void accumulate(ag_dtype dt, const uint16_t *got, const double *ref, int64_t row0,
                       int64_t ref_row0, int64_t rows, int64_t heads, int64_t h, int dim,
                       double *num, double *den, int64_t *unwritten) {
  for (int64_t r = 0; r < rows; r++) {
    const uint16_t *gr = got + ((row0 + r) * heads + h) * dim;
    const double *rr = ref + ((ref_row0 + r) * heads + h) * dim;
    for (int c = 0; c < dim; c++) {
      if (is_nan16(gr[c], dt)) {
        (*unwritten)++;
        continue;
      }
      const double e = ag_half_to_float(dt, gr[c]) - rr[c];
      *num += e * e;
      *den += rr[c] * rr[c];
    }
  }
}

/* Rows [row0, row0 + rows) of a 16-bit tensor of `width` elements a row,
 * as doubles at row `to_row0` of dst. */
static void gather(ag_dtype dt, const uint16_t *src, double *dst, int64_t row0, int64_t to_row0,
                   int64_t rows, int64_t width) {
  const uint16_t *s = src + row0 * width;
  double *d = dst + to_row0 * width;
  for (int64_t i = 0; i < rows * width; i++) d[i] = ag_half_to_float(dt, s[i]);
}

/* The sequences the reference recomputes, per pass (pick[b]: PICK_FWD,
 * PICK_BWD bits): in order while the pass's budget of multiply-adds lasts
 * (heads 0 and H - 1 forward, key heads 0 and G - 1 with their groups
 * backward), and always the first, the longest and the last (whose rows
 * lie furthest into the tensors); every sequence of a pass whose bit is in
 * `all`. */
enum { PICK_FWD = 1, PICK_BWD = 2 };
/* fill.h's streams: q, k, v, dO are 0-3; the rotary tables' angles */
enum { TABLE_STREAM_Q = 8, TABLE_STREAM_K = 9 };

/* The (sequence, head) pairs of a pass into pairs[]: heads 0 and
 * nheads - 1 of each sequence picked for it (pick[b] & bit). Their count. */
static int64_t list_pairs(const uint8_t *pick, uint8_t bit, int64_t batch, int64_t nheads,
                          int64_t *pairs) {
  int64_t n = 0;
  for (int64_t b = 0; b < batch; b++)
    for (int i = 0; (pick[b] & bit) && i < (nheads > 1 ? 2 : 1); i++) {
      pairs[2 * n] = b;
      pairs[2 * n++ + 1] = i ? nheads - 1 : 0;
    }
  return n;
}

static void pick_sequences(const int32_t *lq, const int32_t *lk, int64_t batch, int dim,
                           int64_t H, int64_t G, double budget, bool fwd, bool bwd, uint8_t all,
                           uint8_t *pick) {
  int64_t longest = 0;
  for (int64_t b = 1; b < batch; b++)
    if ((int64_t)lq[b] * lk[b] > (int64_t)lq[longest] * lk[longest]) longest = b;
  for (int pass = 0; pass < 2; pass++) {
    if (!(pass ? bwd : fwd || bwd)) continue; /* the forward's pairs also serve a backward check */
    const uint8_t bit = pass ? PICK_BWD : PICK_FWD;
    const double per_head = pass ? 8.0 * dim * (double)(H / G) : 2.0 * dim * (bwd ? 4 : 1);
    const int heads = (pass ? G : H) > 1 ? 2 : 1;
    double spent = 0;
    for (int64_t b = 0; b < batch; b++) {
      const double macs = per_head * lq[b] * lk[b];
      const bool always = (all & bit) || b == 0 || b == longest || b == batch - 1;
      if (!always && spent + macs * 2 > budget) continue;
      spent += macs * heads;
      pick[b] |= bit;
    }
  }
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* One pass's launch: the jagged calls, or the broadcast ones with the same
 * pointers and sizes. */
typedef struct pass_call {
  bool broadcast;
  int64_t n_q;
  const ag_jagged_fwd_args *fa;
  const ag_jagged_bwd_args *ba;
} pass_call;

static ag_status launch(ag_kernel *k, const pass_call *c, ag_error *err) {
  if (!c->broadcast)
    return c->fa ? ag_jagged_forward(k, c->fa, NULL, err) : ag_jagged_backward(k, c->ba, NULL, err);
  if (c->fa) {
    const ag_jagged_fwd_args *f = c->fa;
    const ag_broadcast_fwd_args a = {.q = f->q, .k = f->k, .v = f->v, .o = f->o, .lse = f->lse,
                                     .cu_seqlens_k = f->cu_seqlens_k, .batch = f->batch,
                                     .n_q = c->n_q, .heads = f->heads, .kv_heads = f->kv_heads,
                                     .total_k = f->total_k,
                                     .host_cu_seqlens_k = f->host_cu_seqlens_k,
                                     .rotary_table = f->rotary_table,
                                     .rotary_table_k = f->rotary_table_k};
    return ag_broadcast_forward(k, &a, NULL, err);
  }
  const ag_jagged_bwd_args *b = c->ba;
  const ag_broadcast_bwd_args a = {.q = b->q, .k = b->k, .v = b->v, .o = b->o, .dout = b->dout,
                                   .lse = b->lse, .dq = b->dq, .dk = b->dk, .dv = b->dv,
                                   .workspace = b->workspace, .cu_seqlens_k = b->cu_seqlens_k,
                                   .batch = b->batch, .n_q = c->n_q, .heads = b->heads,
                                   .kv_heads = b->kv_heads, .total_k = b->total_k,
                                   .host_cu_seqlens_k = b->host_cu_seqlens_k,
                                   .rotary_table = b->rotary_table,
                                   .rotary_table_k = b->rotary_table_k};
  return ag_broadcast_backward(k, &a, NULL, err);
}

/* Median time of `iters` launches of one pass. */
static ag_status time_pass(state *s, ag_kernel *k, const pass_call *c, int iters, double *out_ms,
                           ag_error *err) {
  const ag_driver *d = s->drv;
  CUevent e0 = NULL, e1 = NULL;
  double *ms = calloc((size_t)iters, sizeof *ms);
  ag_status st = ms ? AG_OK : ag_fail(err, AG_ERR_NOMEM, "out of memory");
  if (st == AG_OK) st = ag_cuda_check(err, d->cuEventCreate(&e0, 0), "cuEventCreate");
  if (st == AG_OK) st = ag_cuda_check(err, d->cuEventCreate(&e1, 0), "cuEventCreate");
  for (int i = -2; i < iters && st == AG_OK; i++) { /* two warm-up launches */
    st = ag_cuda_check(err, d->cuEventRecord(e0, NULL), "cuEventRecord");
    if (st == AG_OK) st = launch(k, c, err);
    if (st == AG_OK) st = ag_cuda_check(err, d->cuEventRecord(e1, NULL), "cuEventRecord");
    if (st == AG_OK) st = ag_cuda_check(err, d->cuEventSynchronize(e1), "cuEventSynchronize");
    float t = 0;
    if (st == AG_OK) st = ag_cuda_check(err, d->cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
    if (st == AG_OK && i >= 0) ms[i] = t;
  }
  if (st == AG_OK && iters > 0) {
    qsort(ms, (size_t)iters, sizeof *ms, cmp_double);
    *out_ms = ms[iters / 2];
  }
  if (e0) d->cuEventDestroy(e0);
  if (e1) d->cuEventDestroy(e1);
  free(ms);
  return st;
}

/* The reference's (sequence, head) pairs over the picked sequences'
 * compact double copies, shared between threads: each pair writes its own
 * elements. */
typedef struct ref_job {
  const ag_ref_jagged_params *p;
  const double *rq, *rk, *rv, *rdo;
  const int32_t *cu_q, *cu_k;
  const int64_t *pairs; /* (sequence, head) */
  const int64_t *cidx;  /* sequence -> its index in the compact copies */
  int64_t npairs;
  bool backward;
  double *ro, *rlse, *rdq, *rdk, *rdv;
  int64_t next;
  pthread_mutex_t lock;
} ref_job;

static void *ref_worker(void *arg) {
  ref_job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->lock);
    const int64_t i = j->next++;
    pthread_mutex_unlock(&j->lock);
    if (i >= j->npairs) return NULL;
    const int64_t b = j->cidx[j->pairs[2 * i]], h = j->pairs[2 * i + 1];
    if (j->backward)
      ag_ref_jagged_bwd_part(j->p, j->rq, j->rk, j->rv, j->rdo, j->cu_q, j->cu_k, b, h, j->rdq,
                             j->rdk, j->rdv, NULL, NULL);
    else
      ag_ref_jagged_forward_part_f64(j->p, j->rq, j->rk, j->rv, j->cu_q, j->cu_k, b, h, j->ro,
                                     j->rlse);
  }
}

/* Run the job on up to 16 threads (the calling one if none can start). */
static void ref_run(ref_job *j) {
  enum { THREADS = 16 };
  pthread_t t[THREADS];
  int n = 0;
  pthread_mutex_init(&j->lock, NULL);
  j->next = 0;
  for (; n < THREADS && n < j->npairs; n++)
    if (pthread_create(&t[n], NULL, ref_worker, j)) break;
  if (n == 0) ref_worker(j);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_mutex_destroy(&j->lock);
}

ag_status ag_selfcheck_jagged(ag_kernel *kernel, const int32_t *lq, const int32_t *lk,
                              int64_t batch, const ag_jagged_check_options *opt,
                              ag_jagged_check_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  const ag_spec *spec = ag_kernel_spec(kernel);
  if (!spec || spec->pattern != AG_PATTERN_JAGGED)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_selfcheck_jagged needs a jagged kernel");
  const bool self = lk == NULL;
  if (self) lk = lq;
  /* Broadcast queries: every lq[b] is n_q; the device holds one dense Q
   * (and dQ) of n_q rows, the reference the Q expanded to every sequence,
   * its dQ summed over the batch. */
  const bool bcast = spec->query == AG_QUERY_BROADCAST;
  const int64_t n_q = bcast && batch > 0 ? lq[0] : 0;
  for (int64_t b = 0; bcast && b < batch; b++)
    if (lq[b] != n_q)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "a broadcast check needs every query length equal (n_q)");
  const ag_dtype dt = spec->dtype;
  const int dim = spec->head_dim;
  const int64_t H = opt->heads, G = opt->kv_heads ? opt->kv_heads : opt->heads;
  const bool fwd_pass = spec->passes & AG_PASS_FORWARD;
  const bool bwd = opt->backward && (spec->passes & AG_PASS_BACKWARD);
  if (!fwd_pass && !bwd)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel '%s' has no pass to check", spec->name);
  int32_t *cu_q = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  int32_t *cu_k = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  if (!cu_q || !cu_k) {
    free(cu_q);
    free(cu_k);
    return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  }
  cu_q[0] = cu_k[0] = 0;
  for (int64_t b = 0; b < batch; b++) {
    cu_q[b + 1] = cu_q[b] + lq[b];
    cu_k[b + 1] = cu_k[b] + lk[b];
  }
  const int64_t tq = cu_q[batch], tk = cu_k[batch];
  const size_t nq = (size_t)(tq * H * dim), nk = (size_t)(tk * G * dim);
  const size_t nqd = bcast ? (size_t)(n_q * H * dim) : nq; /* Q and dQ on the device */
  ag_ref_jagged_params rp = {.batch = batch, .total_q = tq, .heads = H, .kv_heads = G,
                             .head_dim = dim, .scale = ag_spec_scale(spec),
                             .causal = spec->causal, .window = spec->has_window,
                             .window_left = spec->window_left, .window_right = spec->window_right};
  /* Rotary embeddings: the reference rotates its double copies of the
   * inputs (queries at positions Lk - Lq on; a broadcast Q's row i at i in
   * every sequence) and rotates its gradients back; with positions from
   * tables, random angles per token, a table for the queries (a broadcast
   * Q's: n_q rows, copied to every sequence of the reference) and one for
   * the keys (self-attention: one for both, passed as rotary_table
   * alone). */
  const bool rot = spec->rotary.layout != AG_ROTARY_NONE;
  const bool tables = rot && spec->rotary.positions == AG_POSITIONS_TABLE;
  const bool own_k = !self || bcast; /* the keys' table apart from the queries' */
  const size_t ntq = tables ? (size_t)(bcast ? n_q : tq) * dim : 0,
               ntk = tables && own_k ? (size_t)tk * dim : 0;
  /* Which sequences the reference recomputes (pick_sequences); their rows
   * alone are copied to doubles, so a run past 2^31 elements needs host
   * memory for its 16-bit tensors and a sample, not for float64 copies of
   * everything. */
  uint8_t *pick = calloc((size_t)batch + 1, 1);
  int64_t *cidx = malloc(sizeof(int64_t) * (size_t)(batch + 1)); /* sequence -> compact index */
  if (!pick || !cidx) {
    free(pick);
    free(cidx);
    free(cu_q);
    free(cu_k);
    return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  }
  const double budget = opt->max_ref_macs > 0 ? opt->max_ref_macs : 4e9;
  /* every sequence: the forward's when a backward-only kernel needs every
   * O and lse from the reference, and both passes' for a broadcast Q's
   * backward, whose dQ sums the batch */
  const uint8_t all = (uint8_t)(((bcast && bwd) || (bwd && !fwd_pass) ? PICK_FWD : 0) |
                                (bcast && bwd ? PICK_BWD : 0));
  pick_sequences(lq, lk, batch, dim, H, G, budget, fwd_pass, bwd, all, pick);
  int64_t nc = 0;
  for (int64_t b = 0; b < batch; b++) cidx[b] = pick[b] ? nc++ : -1;
  int32_t *ccu_q = malloc(sizeof(int32_t) * (size_t)(nc + 1));
  int32_t *ccu_k = malloc(sizeof(int32_t) * (size_t)(nc + 1));
  int64_t *cshift = malloc(sizeof(int64_t) * (size_t)(nc + 1));
  if (ccu_q && ccu_k && cshift) {
    ccu_q[0] = ccu_k[0] = 0;
    for (int64_t b = 0; b < batch; b++)
      if (pick[b]) {
        const int64_t c = cidx[b];
        ccu_q[c + 1] = ccu_q[c] + lq[b];
        ccu_k[c + 1] = ccu_k[c] + lk[b];
        cshift[c] = bcast ? 0 : (int64_t)lk[b] - lq[b];
      }
  }
  const bool compact_ok = ccu_q && ccu_k && cshift;
  const int64_t ctq = compact_ok ? ccu_q[nc] : 0, ctk = compact_ok ? ccu_k[nc] : 0;
  const size_t cnq = (size_t)(ctq * H * dim), cnk = (size_t)(ctk * G * dim);
  uint16_t *htq = malloc(2 * ntq + 2), *htk = malloc(2 * ntk + 2);
  double *dtq = malloc(8 * (size_t)ctq * (tables ? dim : 0) + 8);
  double *dtk = malloc(8 * (size_t)ctk * (tables && own_k ? dim : 0) + 8);
  /* Host buffers: 16-bit inputs and outputs, double copies of the picked rows. */
  uint16_t *hq = malloc(2 * nq + 1), *hk = malloc(2 * nk + 1), *hv = malloc(2 * nk + 1),
           *ho = malloc(2 * nq + 1), *hdo = malloc(bwd ? 2 * nq + 1 : 1),
           *hdq = malloc(bwd ? 2 * nq + 1 : 1), *hdk = malloc(bwd ? 2 * nk + 1 : 1),
           *hdv = malloc(bwd ? 2 * nk + 1 : 1),
           *rep = malloc(bwd && opt->repeat_backward > 0 ? 2 * (nq + 2 * nk) + 1 : 1);
  float *hlse = malloc(4 * (size_t)(H * tq) + 4);
  double *rq = calloc(cnq + 1, 8), *rk = calloc(cnk + 1, 8), *rv = calloc(cnk + 1, 8),
         *rdo = bwd ? calloc(cnq + 1, 8) : NULL, *ro = calloc(cnq + 1, 8),
         *rlse = calloc((size_t)(H * ctq) + 1, 8), *rdq = bwd ? calloc(cnq + 1, 8) : NULL,
         *rdk = bwd ? calloc(cnk + 1, 8) : NULL, *rdv = bwd ? calloc(cnk + 1, 8) : NULL;
  state s = {.drv = kernel->ctx->drv, .ctx = kernel->ctx};
  ag_status st = AG_OK;
  int64_t *pairs = NULL; /* the (sequence, head) pairs the reference checks */
  if (!hq || !hk || !hv || !hdo || !ho || !hdq || !hdk || !hdv || !rep || !hlse || !ro ||
      !rlse || (bwd && (!rdo || !rdq || !rdk || !rdv)) || !rq || !rk || !rv || !htq || !htk ||
      !dtq || !dtk || !ccu_q || !ccu_k || !cshift) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory for the self-check's host buffers");
    goto done;
  }
  /* Inputs in [-1, 1) from (seed, tensor, element) (fill.h: host threads;
   * dO only for the backward); a broadcast Q: its first n_q rows drawn,
   * then copied to every sequence. */
  uint16_t *srcs[4] = {hq, hk, hv, hdo};
  double *dsts[4] = {rq, rk, rv, rdo};
  const size_t counts[4] = {bcast ? nqd : nq, nk, nk, bwd ? nq : 0};
  for (int t = 0; t < 4; t++) ag_fill_inputs(srcs[t], dt, opt->seed, t, 0.5f, 0, counts[t]);
  for (size_t i = nqd; bcast && nqd > 0 && i < nq; i += nqd)
    memcpy(hq + i, hq, 2 * (nq - i < nqd ? nq - i : nqd));
  /* The rotary tables (the queries', the keys'): sin, then cos, of an
   * angle per (token, pair), rounded to the dtype. */
  ag_fill_table(htq, dt, opt->seed, TABLE_STREAM_Q, dim, 0, ntq);
  ag_fill_table(htk, dt, opt->seed, TABLE_STREAM_K, dim, 0, ntk);
  /* The picked rows in doubles: q, k, v, dO and the tables. */
  for (int64_t b = 0; b < batch; b++) {
    if (!pick[b]) continue;
    const int64_t c = cidx[b];
    gather(dt, hq, rq, cu_q[b], ccu_q[c], lq[b], H * dim);
    gather(dt, hk, rk, cu_k[b], ccu_k[c], lk[b], G * dim);
    gather(dt, hv, rv, cu_k[b], ccu_k[c], lk[b], G * dim);
    if (bwd) gather(dt, hdo, rdo, cu_q[b], ccu_q[c], lq[b], H * dim);
    if (tables) gather(dt, htq, dtq, bcast ? 0 : cu_q[b], ccu_q[c], lq[b], dim);
    if (tables && own_k) gather(dt, htk, dtk, cu_k[b], ccu_k[c], lk[b], dim);
  }
  ag_ref_jagged_params rc = rp; /* the reference's problem: the picked sequences */
  rc.batch = nc;
  rc.total_q = ctq;
  const ag_ref_rotary rot_q = {.layout = spec->rotary.layout, .positions = spec->rotary.positions,
                               .base = spec->rotary.base, .table = dtq};
  const ag_ref_rotary rot_k = {.layout = spec->rotary.layout, .positions = spec->rotary.positions,
                               .base = spec->rotary.base, .table = own_k ? dtk : dtq};
  const unsigned apply = rot ? spec->rotary.apply_to : 0;
  if (apply & AG_APPLY_Q) ag_ref_rotary_apply_shifted(&rot_q, false, ccu_q, cshift, nc, H, dim, rq);
  if (apply & AG_APPLY_K) ag_ref_rotary_apply(&rot_k, false, ccu_k, nc, G, dim, rk);
  if (apply & AG_APPLY_V) ag_ref_rotary_apply(&rot_k, false, ccu_k, nc, G, dim, rv);
  /* The kernels round each rotated value to the dtype once; so does the
   * reference, and its error measures the attention alone. */
  const size_t ccounts[3] = {cnq, cnk, cnk};
  for (int t = 0; t < 3; t++)
    for (size_t i = 0; (apply & (AG_APPLY_Q << t)) && i < ccounts[t]; i++)
      dsts[t][i] = ag_half_to_float(dt, ag_float_to_half(dt, (float)dsts[t][i]));
  if ((st = ag_cuda_check(err, s.drv->cuCtxPushCurrent(s.ctx->cu), "cuCtxPushCurrent"))) goto done;
  const size_t ws = bcast ? ag_broadcast_backward_workspace_bytes(kernel, batch, n_q, H)
                          : ag_jagged_backward_workspace_bytes(kernel, H, tq);
  const size_t sizes[NBUF] = {2 * nqd, 2 * nk, 2 * nk, 2 * nq, 4 * (size_t)(H * tq), 2 * nq,
                              2 * nqd, 2 * nk, 2 * nk, ws,
                              4 * (size_t)(batch + 1), 4 * (size_t)(batch + 1), 2 * ntq, 2 * ntk};
  for (int i = 0; i < NBUF && st == AG_OK; i++)
    st = dev_alloc(&s, i, bwd || i < B_DO || i >= B_CUQ ? sizes[i] : 0, err);
  if (st == AG_OK) st = upload(&s, B_Q, hq, err); /* broadcast: its first n_q rows */
  if (st == AG_OK) st = upload(&s, B_K, hk, err);
  if (st == AG_OK) st = upload(&s, B_V, hv, err);
  if (st == AG_OK) st = upload(&s, B_DO, hdo, err);
  if (st == AG_OK) st = upload(&s, B_CUQ, cu_q, err);
  if (st == AG_OK) st = upload(&s, B_CUK, cu_k, err);
  if (st == AG_OK) st = upload(&s, B_TQ, htq, err);
  if (st == AG_OK) st = upload(&s, B_TK, htk, err);
  const void *table_q = tables ? (const void *)s.d[B_TQ] : NULL;
  const void *table_k = tables && own_k ? (const void *)s.d[B_TK] : NULL;
  if (st == AG_OK) st = poison(&s, B_O, false, err);
  if (st == AG_OK) st = poison(&s, B_LSE, true, err);
  const CUdeviceptr cuk = self ? s.d[B_CUQ] : s.d[B_CUK];
  ag_jagged_fwd_args fa = {.q = (void *)s.d[B_Q], .k = (void *)s.d[B_K], .v = (void *)s.d[B_V],
                           .o = (void *)s.d[B_O], .lse = (float *)s.d[B_LSE],
                           .cu_seqlens_q = (const int32_t *)s.d[B_CUQ],
                           .cu_seqlens_k = (const int32_t *)cuk, .batch = batch, .heads = H,
                           .kv_heads = G, .total_q = tq, .total_k = tk,
                           .host_cu_seqlens_q = cu_q, .host_cu_seqlens_k = cu_k,
                           .rotary_table = table_q, .rotary_table_k = table_k};
  /* The backward needs the forward's O and lse: a kernel of the backward
   * alone gets them from the reference, rounded as a forward would. */
  const pass_call fcall = {bcast, n_q, &fa, NULL};
  if (st == AG_OK && fwd_pass) st = launch(kernel, &fcall, err);
  if (st == AG_OK) st = ag_cuda_check(err, s.drv->cuCtxSynchronize(), "forward");
  if (st == AG_OK) st = download(&s, B_O, ho, err);
  if (st == AG_OK) st = download(&s, B_LSE, hlse, err);
  if (st != AG_OK) goto pop;

  double num = 0, den = 0, gnum[3] = {0}, gden[3] = {0};
  pairs = malloc(sizeof(int64_t) * 4 * (size_t)(nc + 1));
  if (!pairs) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto pop;
  }
  /* The forward's pairs: heads 0 and H - 1 of its picked sequences. */
  int64_t npairs = list_pairs(pick, PICK_FWD, batch, H, pairs);
  ref_job job = {.p = &rc, .rq = rq, .rk = rk, .rv = rv, .rdo = rdo, .cu_q = ccu_q,
                 .cu_k = ccu_k, .pairs = pairs, .cidx = cidx, .npairs = npairs, .ro = ro,
                 .rlse = rlse, .rdq = rdq, .rdk = rdk, .rdv = rdv};
  if (!fwd_pass) job.npairs = 0; /* the whole forward is computed below instead */
  ref_run(&job);
  out->checked_pairs = npairs;
  for (int64_t i = 0; i < npairs && fwd_pass; i++) {
    const int64_t b = pairs[2 * i], h = pairs[2 * i + 1], c = cidx[b];
    accumulate(dt, ho, ro, cu_q[b], ccu_q[c], lq[b], H, h, dim, &num, &den, &out->unwritten);
    for (int64_t r = 0; r < lq[b]; r++) {
      const float g = hlse[h * tq + cu_q[b] + r];
      const double want = rlse[h * ctq + ccu_q[c] + r];
      if (isnan(g)) out->unwritten++;
      else if (isinf(want) || isinf(g)) out->lse_mismatch += isinf(want) != isinf(g);
      else if (fabs(g - want) > out->lse_abs) out->lse_abs = fabs(g - want);
    }
  }
  out->rel_o = den > 0 ? sqrt(num / den) : 0;
  for (int64_t b = 0; b < batch; b++) /* useful FLOPs: 4 D per visible pair */
    for (int64_t i = 0; i < lq[b]; i++) {
      int64_t lo, hi;
      ag_ref_jagged_key_range(&rp, lq[b], lk[b], i, &lo, &hi);
      if (hi > lo) out->fwd_flops += 4.0 * dim * (double)(hi - lo) * (double)H;
    }

  if (bwd) {
    if (!fwd_pass) { /* O and lse from the reference (every sequence is picked) */
      ag_ref_jagged_forward_f64(&rc, rq, rk, rv, ccu_q, ccu_k, ro, rlse);
      for (size_t i = 0; i < nq; i++) ho[i] = ag_float_to_half(dt, (float)ro[i]);
      for (int64_t i = 0; i < H * tq; i++) hlse[i] = (float)rlse[i];
      if ((st = upload(&s, B_O, ho, err)) || (st = upload(&s, B_LSE, hlse, err))) goto pop;
    }
    ag_jagged_bwd_args ba = {.q = (void *)s.d[B_Q], .k = (void *)s.d[B_K], .v = (void *)s.d[B_V],
                             .o = (void *)s.d[B_O], .dout = (void *)s.d[B_DO],
                             .lse = (const float *)s.d[B_LSE], .dq = (void *)s.d[B_DQ],
                             .dk = (void *)s.d[B_DK], .dv = (void *)s.d[B_DV],
                             .workspace = (float *)s.d[B_WS],
                             .cu_seqlens_q = (const int32_t *)s.d[B_CUQ],
                             .cu_seqlens_k = (const int32_t *)cuk, .batch = batch, .heads = H,
                             .kv_heads = G, .total_q = tq, .total_k = tk,
                             .host_cu_seqlens_q = cu_q, .host_cu_seqlens_k = cu_k,
                             .rotary_table = table_q, .rotary_table_k = table_k};
    const pass_call bcall = {bcast, n_q, NULL, &ba};
    out->bitwise_repeatable = out->dkv_repeatable = true;
    out->dq_by_atomics = kernel->plan.jagged.fast.block_m > 0;
    for (int run = 0; run <= opt->repeat_backward && st == AG_OK; run++) {
      if ((st = poison(&s, B_DQ, false, err)) || (st = poison(&s, B_DK, false, err)) ||
          (st = poison(&s, B_DV, false, err)) || (st = poison(&s, B_WS, true, err)))
        break;
      if ((st = launch(kernel, &bcall, err))) break;
      if ((st = ag_cuda_check(err, s.drv->cuCtxSynchronize(), "backward"))) break;
      uint16_t *dst[3] = {run ? rep : hdq, run ? rep + nqd : hdk, run ? rep + nqd + nk : hdv};
      if ((st = download(&s, B_DQ, dst[0], err)) || (st = download(&s, B_DK, dst[1], err)) ||
          (st = download(&s, B_DV, dst[2], err)))
        break;
      if (run && (memcmp(rep + nqd, hdk, 2 * nk) || memcmp(rep + nqd + nk, hdv, 2 * nk)))
        out->bitwise_repeatable = out->dkv_repeatable = false;
      if (run && memcmp(rep, hdq, 2 * nqd)) out->bitwise_repeatable = false;
    }
    if (st != AG_OK) goto pop;
    /* The reference gradients of the picked sequences' key heads 0 and G
     * - 1 (every head of a checked key head's group contributes to its
     * dK, dV). */
    const int64_t group = H / G;
    npairs = list_pairs(pick, PICK_BWD, batch, G, pairs);
    job.npairs = npairs;
    job.backward = true;
    out->checked_grad_pairs = npairs;
    ref_run(&job);
    /* gradients of the unrotated inputs: R^T of the rotated ones' */
    if (apply & AG_APPLY_Q) ag_ref_rotary_apply_shifted(&rot_q, true, ccu_q, cshift, nc, H, dim, rdq);
    if (apply & AG_APPLY_K) ag_ref_rotary_apply(&rot_k, true, ccu_k, nc, G, dim, rdk);
    if (apply & AG_APPLY_V) ag_ref_rotary_apply(&rot_k, true, ccu_k, nc, G, dim, rdv);
    if (bcast) { /* dQ: the expanded reference summed over the batch (all picked), rows 0..n_q */
      for (int64_t b = 1; b < batch; b++)
        for (size_t i = 0; i < nqd; i++) rdq[i] += rdq[(size_t)b * nqd + i];
      for (int gi = 0; gi < (G > 1 ? 2 : 1); gi++)
        for (int64_t h = (gi ? G - 1 : 0) * group; h < ((gi ? G - 1 : 0) + 1) * group; h++)
          accumulate(dt, hdq, rdq, 0, 0, n_q, H, h, dim, &gnum[0], &gden[0], &out->unwritten);
    }
    for (int64_t i = 0; i < npairs; i++) {
      const int64_t b = pairs[2 * i], g = pairs[2 * i + 1], c = cidx[b];
      for (int64_t h = g * group; h < (g + 1) * group && !bcast; h++)
        accumulate(dt, hdq, rdq, cu_q[b], ccu_q[c], lq[b], H, h, dim, &gnum[0], &gden[0],
                   &out->unwritten);
      accumulate(dt, hdk, rdk, cu_k[b], ccu_k[c], lk[b], G, g, dim, &gnum[1], &gden[1],
                 &out->unwritten);
      accumulate(dt, hdv, rdv, cu_k[b], ccu_k[c], lk[b], G, g, dim, &gnum[2], &gden[2],
                 &out->unwritten);
    }
    out->rel_dq = gden[0] > 0 ? sqrt(gnum[0] / gden[0]) : 0;
    out->rel_dk = gden[1] > 0 ? sqrt(gnum[1] / gden[1]) : 0;
    out->rel_dv = gden[2] > 0 ? sqrt(gnum[2] / gden[2]) : 0;
    if (opt->iters > 0) st = time_pass(&s, kernel, &bcall, opt->iters, &out->bwd_ms, err);
  }
  if (st == AG_OK && fwd_pass && opt->iters > 0)
    st = time_pass(&s, kernel, &fcall, opt->iters, &out->fwd_ms, err);
pop:;
  free(pairs);
  CUcontext popped;
  for (int i = 0; i < NBUF; i++)
    if (s.d[i]) s.drv->cuMemFree(s.d[i]);
  s.drv->cuCtxPopCurrent(&popped);
done:
  free(cu_q);
  free(cu_k);
  free(hq);
  free(hk);
  free(hv);
  free(hdo);
  free(ho);
  free(hdq);
  free(hdk);
  free(hdv);
  free(rep);
  free(hlse);
  free(rq);
  free(rk);
  free(rv);
  free(rdo);
  free(ro);
  free(rlse);
  free(rdq);
  free(rdk);
  free(rdv);
  free(htq);
  free(htk);
  free(dtq);
  free(dtk);
  free(pick);
  free(cidx);
  free(ccu_q);
  free(ccu_k);
  free(cshift);
  return st;
}
