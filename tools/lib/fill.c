// SPDX-License-Identifier: BSD-3-Clause
/* fill.c: the self-checks' random inputs and rotary tables, by host
 * threads (see fill.h). At batch 1152 and L 4096 the jagged check draws
 * about 5e9 values: one thread took most of a run's 19 s. */
#include "fill.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <unistd.h>

#include "reference.h"

float ag_input_value(uint64_t seed, int which, uint64_t e) {
  uint64_t x = seed ^ ((uint64_t)(which + 1) * 0x9e3779b97f4a7c15ull) ^ (e * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)((double)(x >> 11) * (4.0 / 9007199254740992.0) - 2.0);
}

uint16_t ag_table_value(uint64_t seed, int which, ag_dtype dtype, int dim, uint64_t t, int col) {
  const int pairs = dim / 2;
  if (pairs < 1) return 0; /* no pair in a row */
  const int i = col % pairs;
  double a = ag_input_value(seed, which, t * (uint64_t)pairs + (uint64_t)i) * (M_PI / 2);
  return ag_float_to_half(dtype, (float)(col < pairs ? sin(a) : cos(a)));
}

enum { MAX_THREADS = 32, MIN_SLICE = 1 << 16 }; /* fewer values: one thread */

typedef struct fill_job {
  uint16_t *dst;
  uint64_t at, count, seed;
  ag_dtype dtype;
  int which, dim; /* dim > 0: a table's elements */
  float scale;
} fill_job;

static void *fill_slice(void *arg) {
  const fill_job *j = arg;
  if (j->dim > 0) {
    for (uint64_t i = 0; i < j->count; i++) {
      const uint64_t e = j->at + i;
      j->dst[i] = ag_table_value(j->seed, j->which, j->dtype, j->dim, e / (uint64_t)j->dim,
                                 (int)(e % (uint64_t)j->dim));
    }
  } else {
    for (uint64_t i = 0; i < j->count; i++)
      j->dst[i] =
          ag_float_to_half(j->dtype, ag_input_value(j->seed, j->which, j->at + i) * j->scale);
  }
  return NULL;
}

/* job's count values in slices, one a thread; a thread that cannot start
 * leaves its slice to this one. */
static void fill_threads(const fill_job *job) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  uint64_t threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (uint64_t)cpus;
  const uint64_t slices = job->count / MIN_SLICE; /* of at least MIN_SLICE values */
  if (slices < threads) threads = slices > 0 ? slices : 1;
  fill_job jobs[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  bool started[MAX_THREADS] = {false};
  const uint64_t per = (job->count + threads - 1) / threads;
  for (uint64_t t = 0; t < threads; t++) {
    const uint64_t lo = per * t < job->count ? per * t : job->count;
    const uint64_t hi = lo + per < job->count ? lo + per : job->count;
    jobs[t] = *job;
    jobs[t].dst = job->dst + lo;
    jobs[t].at = job->at + lo;
    jobs[t].count = hi - lo;
    started[t] = t > 0 && pthread_create(&tid[t], NULL, fill_slice, &jobs[t]) == 0;
  }
  for (uint64_t t = 0; t < threads; t++)
    if (!started[t]) fill_slice(&jobs[t]);
  for (uint64_t t = 1; t < threads; t++)
    if (started[t]) pthread_join(tid[t], NULL);
}

void ag_fill_inputs(uint16_t *dst, ag_dtype dtype, uint64_t seed, int which, float scale,
                    uint64_t at, uint64_t n) {
  const fill_job job = {dst, at, n, seed, dtype, which, 0, scale};
  fill_threads(&job);
}

void ag_fill_table(uint16_t *dst, ag_dtype dtype, uint64_t seed, int which, int dim,
                   uint64_t at, uint64_t n) {
  const fill_job job = {dst, at, n, seed, dtype, which, dim > 0 ? dim : 1, 1.0f};
  fill_threads(&job);
}
