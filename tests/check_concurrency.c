// SPDX-License-Identifier: BSD-3-Clause
/* check_concurrency.c: many processes and threads asking ag_compile for the
 * same and different kernels at once through one fresh disk cache, with the
 * cache entry being damaged under them, and threads loading specs at once:
 * every cubin must equal a reference compile, and the cache must end with
 * exactly one valid entry per key and no temporary files. `make tsan` runs
 * this suite under ThreadSanitizer. Runs from tests/. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime.h"
#include "util.h"

#define ARCH "sm_90a"
#define N_SPECS 3
static const char *const spec_paths[N_SPECS] = {
    "../specs/ads_block64_d128_bf16.yaml",
    "../specs/ads_block64_d64_fp16.yaml",
    "../specs/block128_d128_causal.yaml",
};

/* ---- fixtures ----------------------------------------------------------------- */

typedef struct reference {
  ag_spec spec[N_SPECS];
  void *cubin[N_SPECS]; /* compiled with the disk cache disabled */
  size_t size[N_SPECS];
} reference;

static reference ref;
static char *cache_dir;

/* A fresh cache directory and the reference cubins; the environment is set
 * here, before any thread starts (getenv is not safe against setenv). */
static void setup(void) {
  cache_dir = strdup("/tmp/attngen-concurrency-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(cache_dir));
  unsetenv(AG_ENV_DUMP_DIR);
  unsetenv(AG_ENV_NVRTC_VERBOSE);
  setenv(AG_ENV_CACHE_DIR, cache_dir, 1);
  setenv(AG_ENV_CACHE_DISABLE, "1", 1);
  for (int i = 0; i < N_SPECS; i++) {
    ag_error err = {0};
    ck_assert_msg(ag_spec_load_file(spec_paths[i], &ref.spec[i], &err) == AG_OK, "%s",
                  err.message);
    ck_assert_msg(ag_compile(&ref.spec[i], ARCH, &ref.cubin[i], &ref.size[i], &err) == AG_OK,
                  "%s", err.message);
  }
  unsetenv(AG_ENV_CACHE_DISABLE);
}

static void teardown(void) {
  for (int i = 0; i < N_SPECS; i++) free(ref.cubin[i]);
  memset(&ref, 0, sizeof ref);
  ag_test_remove_tree(cache_dir);
  free(cache_dir);
  cache_dir = NULL;
}

/* Compile spec i through the cache; 0 when the cubin equals the reference,
 * else a nonzero code with a message written to `why`. */
static int compile_and_compare(int i, ag_cache_origin *out_origin, char *why, size_t why_len) {
  void *cubin = NULL;
  size_t size = 0;
  ag_error err = {0};
  ag_status st = ag_compile_spec(&ref.spec[i], ARCH, &cubin, &size, out_origin, NULL, &err);
  int rc = 0;
  if (st != AG_OK) {
    snprintf(why, why_len, "%s: %s", spec_paths[i], err.message ? err.message : ag_strerror(st));
    rc = 1;
  } else if (size != ref.size[i] || memcmp(cubin, ref.cubin[i], size) != 0) {
    snprintf(why, why_len, "%s: cubin of %zu bytes differs from the reference (%zu bytes)",
             spec_paths[i], size, ref.size[i]);
    rc = 2;
  }
  free(cubin);
  ag_error_clear(&err);
  return rc;
}

/* The cache holds exactly one entry per spec, each valid for its key (the
 * key is in the file name) and equal to the reference; nothing else. */
static void check_cache_consistent(void) {
  DIR *d = opendir(cache_dir);
  ck_assert_ptr_nonnull(d);
  int found[N_SPECS] = {0}, entries = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    entries++;
    ck_assert_msg(!strstr(e->d_name, ".tmp."), "temporary file left: %s", e->d_name);
    size_t n = strlen(e->d_name);
    ck_assert_msg(n > 64 + 6 && strcmp(e->d_name + n - 6, ".cubin") == 0, "stray file: %s",
                  e->d_name);
    uint8_t key[AG_SHA256_BYTES];
    for (int b = 0; b < AG_SHA256_BYTES; b++) {
      unsigned v;
      ck_assert_int_eq(sscanf(e->d_name + 2 * b, "%2x", &v), 1);
      key[b] = (uint8_t)v;
    }
    char *path = NULL;
    ck_assert_int_ge(asprintf(&path, "%s/%s", cache_dir, e->d_name), 0);
    void *cubin = NULL;
    size_t size = 0;
    ck_assert_int_eq(ag_cache_load(path, key, &cubin, &size, NULL), AG_OK);
    ck_assert_msg(cubin != NULL, "%s is not a valid entry for its key", e->d_name);
    int which = -1;
    for (int i = 0; i < N_SPECS; i++)
      if (size == ref.size[i] && memcmp(cubin, ref.cubin[i], size) == 0) which = i;
    ck_assert_msg(which >= 0, "%s matches no reference cubin", e->d_name);
    found[which]++;
    free(cubin);
    free(path);
  }
  closedir(d);
  ck_assert_int_eq(entries, N_SPECS);
  for (int i = 0; i < N_SPECS; i++) ck_assert_int_eq(found[i], 1);
  /* And every spec is now a hit. */
  for (int i = 0; i < N_SPECS; i++) {
    char why[1024];
    ag_cache_origin origin;
    ck_assert_msg(compile_and_compare(i, &origin, why, sizeof why) == 0, "%s", why);
    ck_assert_int_eq(origin, AG_FROM_DISK);
  }
}

/* ---- threads --------------------------------------------------------------------- */

typedef struct worker {
  pthread_t thread;
  int id, rounds;
  pthread_barrier_t *start;
  int rc;
  int from_nvrtc, from_disk;
  char why[1024];
} worker;

/* Spec id % N, then the next ones: at any moment threads ask for the same
 * kernel and for different ones. */
static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_barrier_wait(w->start);
  for (int r = 0; r < w->rounds && w->rc == 0; r++) {
    ag_cache_origin origin = AG_FROM_NVRTC;
    w->rc = compile_and_compare((w->id + r) % N_SPECS, &origin, w->why, sizeof w->why);
    if (origin == AG_FROM_DISK) w->from_disk++;
    else w->from_nvrtc++;
  }
  return NULL;
}

/* Run n threads of `rounds` compiles each; 0 when all matched, else the
 * first failure's code, its message written to why. */
static int run_threads(int n, int rounds, int *out_nvrtc, char *why, size_t why_len) {
  worker *w = calloc((size_t)n, sizeof *w);
  if (!w) return 3;
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    w[i] = (worker){.id = i, .rounds = rounds, .start = &start};
    if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) != 0) abort();
  }
  int rc = 0, nvrtc = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(w[i].thread, NULL);
    nvrtc += w[i].from_nvrtc;
    if (w[i].rc && !rc) {
      rc = w[i].rc;
      snprintf(why, why_len, "thread %d: %s", i, w[i].why);
    }
  }
  pthread_barrier_destroy(&start);
  free(w);
  if (out_nvrtc) *out_nvrtc = nvrtc;
  return rc;
}

/* 16 threads of one process, three compiles each over three specs. */
START_TEST(threads_same_and_different_kernels) {
  char why[1200] = "";
  int nvrtc = 0;
  int rc = run_threads(16, N_SPECS, &nvrtc, why, sizeof why);
  ck_assert_msg(rc == 0, "%s", why);
  ck_assert_int_ge(nvrtc, N_SPECS); /* each kernel compiled at least once */
  check_cache_consistent();
}
END_TEST

/* ---- processes ------------------------------------------------------------------- */

/* Fork n children, released together, each running `threads` threads of
 * `rounds` compiles; asserts every child exits 0. */
static void run_processes(int n, int threads, int rounds) {
  int gate[2];
  ck_assert_int_eq(pipe(gate), 0);
  pid_t *pids = calloc((size_t)n, sizeof *pids);
  ck_assert_ptr_nonnull(pids);
  for (int i = 0; i < n; i++) {
    fflush(NULL);
    pids[i] = fork();
    ck_assert_int_ge(pids[i], 0);
    if (pids[i] == 0) {
      char c, why[1200] = "";
      close(gate[1]);
      if (read(gate[0], &c, 1) != 0) _exit(4); /* released when the parent closes */
      int rc = 0;
      if (threads > 1) {
        rc = run_threads(threads, rounds, NULL, why, sizeof why);
      } else {
        for (int r = 0; r < rounds && rc == 0; r++)
          rc = compile_and_compare((i + r) % N_SPECS, NULL, why, sizeof why);
      }
      if (rc) fprintf(stderr, "process %d: %s\n", i, why);
      _exit(rc);
    }
  }
  close(gate[0]);
  close(gate[1]);
  for (int i = 0; i < n; i++) {
    int status = 0;
    ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
    ck_assert_msg(WIFEXITED(status), "process %d died (signal %d)", i,
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    ck_assert_msg(WEXITSTATUS(status) == 0, "process %d exited %d (1: compile failed, "
                  "2: cubin differs; see stderr)", i, WEXITSTATUS(status));
  }
  free(pids);
}

/* 8 processes, three compiles each over three specs, starting apart. */
START_TEST(processes_same_and_different_kernels) {
  run_processes(8, 1, N_SPECS);
  check_cache_consistent();
}
END_TEST

/* 4 processes of 4 threads each on one cache. */
START_TEST(processes_of_threads) {
  run_processes(4, 4, 2);
  /* Two rounds from ids 0..3 cover every spec. */
  check_cache_consistent();
}
END_TEST

/* ---- a cache damaged while in use ------------------------------------------------- */

typedef struct vandal {
  pthread_t thread;
  const char *path;
  int stop;             /* under lock: set by the main thread */
  pthread_mutex_t lock;
  int damages;
} vandal;

static bool vandal_stopped(vandal *v) {
  pthread_mutex_lock(&v->lock);
  bool stop = v->stop;
  pthread_mutex_unlock(&v->lock);
  return stop;
}

/* Truncate, flip bytes in place or replace with garbage, over and over. */
static void *vandal_main(void *arg) {
  vandal *v = arg;
  unsigned rng = 7;
  while (!vandal_stopped(v)) {
    rng = rng * 1103515245u + 12345u;
    int fd = open(v->path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      struct stat sb;
      if (fstat(fd, &sb) == 0 && sb.st_size > 0) {
        switch ((rng >> 16) % 3) {
        case 0:
          if (ftruncate(fd, (off_t)((rng >> 8) % (unsigned)sb.st_size)) != 0) break;
          v->damages++;
          break;
        case 1: {
          char junk = (char)(rng >> 3);
          if (pwrite(fd, &junk, 1, (off_t)((rng >> 8) % (unsigned)sb.st_size)) == 1)
            v->damages++;
          break;
        }
        default: {
          char junk[64];
          memset(junk, (int)(rng >> 24), sizeof junk);
          if (pwrite(fd, junk, sizeof junk, 0) == (ssize_t)sizeof junk) v->damages++;
          break;
        }
        }
      }
      close(fd);
    }
    usleep(2000);
  }
  return NULL;
}

/* 8 threads compile the three kernels 8 times each while the first one's
 * entry is damaged in place (truncated, bytes flipped, header overwritten):
 * a damaged entry is a miss and is replaced, never a wrong cubin. */
START_TEST(entry_damaged_while_in_use) {
  char why[1200] = "";
  ag_cache_origin origin;
  ck_assert_msg(compile_and_compare(0, &origin, why, sizeof why) == 0, "%s", why);
  DIR *d = opendir(cache_dir);
  ck_assert_ptr_nonnull(d);
  char *path = NULL;
  for (struct dirent *e; (e = readdir(d));)
    if (e->d_name[0] != '.') ck_assert_int_ge(asprintf(&path, "%s/%s", cache_dir, e->d_name), 0);
  closedir(d);
  ck_assert_ptr_nonnull(path);

  vandal v = {.path = path};
  pthread_mutex_init(&v.lock, NULL);
  ck_assert_int_eq(pthread_create(&v.thread, NULL, vandal_main, &v), 0);
  worker w[8];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 8);
  for (int i = 0; i < 8; i++) {
    w[i] = (worker){.id = 0, .rounds = 8, .start = &start};
    ck_assert_int_eq(pthread_create(&w[i].thread, NULL, worker_main, &w[i]), 0);
  }
  int rc = 0, nvrtc = 0;
  for (int i = 0; i < 8; i++) {
    pthread_join(w[i].thread, NULL);
    nvrtc += w[i].from_nvrtc;
    if (w[i].rc && !rc) {
      rc = w[i].rc;
      snprintf(why, sizeof why, "thread %d: %s", i, w[i].why);
    }
  }
  pthread_mutex_lock(&v.lock);
  v.stop = 1;
  pthread_mutex_unlock(&v.lock);
  pthread_join(v.thread, NULL);
  pthread_mutex_destroy(&v.lock);
  pthread_barrier_destroy(&start);
  ck_assert_msg(rc == 0, "%s", why);
  ck_assert_int_ge(nvrtc, N_SPECS - 1); /* the two kernels not cached yet, at least */
  ck_assert_int_gt(v.damages, 0);
  /* Once left alone, the next compile leaves one valid entry. */
  ck_assert_msg(compile_and_compare(0, &origin, why, sizeof why) == 0, "%s", why);
  for (int i = 1; i < N_SPECS; i++)
    ck_assert_msg(compile_and_compare(i, &origin, why, sizeof why) == 0, "%s", why);
  check_cache_consistent();
  free(path);
}
END_TEST

/* ---- specs from many threads -------------------------------------------------------- */

static const char *const load_inputs[] = {
    "../specs/ads_block64_d128_bf16.yaml",
    "../specs/block128_d128_causal.yaml",
    "../specs/ads_block64_d128_rope.yaml",
    "spec_errors/alias_bomb.yaml",
    "spec_errors/many_errors_in_order.yaml",
    "spec_errors/softmax_scale_text.yaml",
    "spec_errors/rotary_base_bad.yaml",
    "spec_errors/unsupported_rotary_table_block_size.yaml",
    "spec_errors/invalid_utf8.yaml",
};
#define N_LOADS (int)(sizeof load_inputs / sizeof load_inputs[0])

typedef struct loader {
  pthread_t thread;
  const ag_status *want_st;
  char *const *want_msg;
  int mismatches;
} loader;

static void *loader_main(void *arg) {
  loader *l = arg;
  for (int round = 0; round < 20; round++)
    for (int i = 0; i < N_LOADS; i++) {
      ag_error err = {0};
      ag_spec s;
      ag_status st = ag_spec_load_file(load_inputs[i], &s, &err);
      if (st != l->want_st[i] || (err.message == NULL) != (l->want_msg[i] == NULL) ||
          (err.message && strcmp(err.message, l->want_msg[i]) != 0))
        l->mismatches++;
      ag_error_clear(&err);
    }
  return NULL;
}

/* The spec front end is thread-safe: 16 threads loading valid and invalid
 * specs (numbers go through a per-call C locale) get the single-threaded
 * results. */
START_TEST(threads_load_specs) {
  ag_status want_st[N_LOADS];
  char *want_msg[N_LOADS];
  for (int i = 0; i < N_LOADS; i++) {
    ag_error err = {0};
    want_st[i] = ag_spec_load_file(load_inputs[i], NULL, &err);
    ck_assert_int_ne(want_st[i], AG_ERR_IO);
    want_msg[i] = err.message;
  }
  loader l[16];
  for (int i = 0; i < 16; i++) {
    l[i] = (loader){.want_st = want_st, .want_msg = want_msg};
    ck_assert_int_eq(pthread_create(&l[i].thread, NULL, loader_main, &l[i]), 0);
  }
  int mismatches = 0;
  for (int i = 0; i < 16; i++) {
    pthread_join(l[i].thread, NULL);
    mismatches += l[i].mismatches;
  }
  for (int i = 0; i < N_LOADS; i++) free(want_msg[i]);
  ck_assert_int_eq(mismatches, 0);
}
END_TEST

Suite *concurrency_suite(void) {
  Suite *s = suite_create("concurrency");
  TCase *tc = tcase_create("compile");
  tcase_set_timeout(tc, 600); /* NVRTC, several compiles at once on few cores */
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, threads_same_and_different_kernels);
  tcase_add_test(tc, processes_same_and_different_kernels);
  tcase_add_test(tc, processes_of_threads);
  tcase_add_test(tc, entry_damaged_while_in_use);
  suite_add_tcase(s, tc);
  tc = tcase_create("spec");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, threads_load_specs);
  suite_add_tcase(s, tc);
  return s;
}
