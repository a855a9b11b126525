/* use_build.c: an application of `attngen build`'s output, as a user
 * writes one (tools/test_build.sh builds and runs it): it includes two
 * generated headers, links their _kernels.c files and libattngen, and
 * checks what it can without a GPU: the embedded images are the cubins
 * build wrote (argv[1..]: "ARCH=PATH" pairs of ads_block64_d64), the
 * embedded spec loads, plans and names the kernels the images hold, and
 * NAME_load refuses a missing context. With a GPU it loads both kernels
 * from the images (no NVRTC compile) and prints their names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ads_block64_d64.h"
#include "pma_broadcast.h"

static int fail(const char *what) {
  fprintf(stderr, "use_build: FAIL: %s\n", what);
  return 1;
}

/* Whether the bytes of s (with its NUL) occur in p[0..n). */
static int contains(const void *p, size_t n, const char *s) {
  const size_t len = strlen(s) + 1;
  for (size_t i = 0; i + len <= n; i++)
    if (memcmp((const char *)p + i, s, len) == 0) return 1;
  return 0;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

int main(int argc, char **argv) {
  int n = 0;
  const ag_image *im = ads_block64_d64_images(&n);
  if (n != argc - 1) return fail("image count");
  for (int i = 1; i < argc; i++) {
    const char *eq = strchr(argv[i], '=');
    if (!eq) return fail("ARCH=PATH");
    size_t len = 0;
    char *cubin = slurp(eq + 1, &len);
    const ag_image *found = NULL;
    for (int j = 0; j < n; j++)
      if (strlen(im[j].arch) == (size_t)(eq - argv[i]) && !strncmp(im[j].arch, argv[i], eq - argv[i]))
        found = &im[j];
    if (!cubin || !found || found->size != len || memcmp(found->cubin, cubin, len) != 0)
      return fail("an embedded image differs from the cubin build wrote");
    free(cubin);
  }
  if (strcmp(ads_block64_d64_ARCHS, "sm_80,sm_90a") != 0) return fail("ARCHS");
  ag_spec spec;
  ag_error err = {0};
  const char *yaml = pma_broadcast_spec_yaml();
  if (ag_spec_load_string(yaml, strlen(yaml), "embedded", &spec, &err) != AG_OK ||
      strcmp(spec.name, "pma_broadcast") != 0 || spec.query != AG_QUERY_BROADCAST)
    return fail("the embedded spec");
  char name[AG_KERNEL_NAME_MAX];
  char *source = NULL;
  if (ag_emit(&spec, &source, name, &err) != AG_OK) return fail("emit");
  free(source);
  const ag_image *pi = pma_broadcast_images(&n);
  for (int j = 0; j < n; j++)
    if (!contains(pi[j].cubin, pi[j].size, name))
      return fail("an image lacks the spec's first kernel");
  ag_kernel *k = NULL;
  if (pma_broadcast_load(NULL, &k, &err) != AG_ERR_INVALID_ARGUMENT || k) return fail("NULL ctx");
  ag_error_clear(&err);
  ag_context *ctx = NULL;
  if (ag_context_create(0, &ctx, &err) != AG_OK) {
    printf("use_build: ok without a GPU (%s)\n", err.message);
    ag_error_clear(&err);
    return 0;
  }
  ag_kernel *a = NULL, *b = NULL;
  if (ads_block64_d64_load(ctx, &a, &err) != AG_OK || pma_broadcast_load(ctx, &b, &err) != AG_OK) {
    fprintf(stderr, "use_build: FAIL: load: %s\n", err.message);
    return 1;
  }
  printf("use_build: ok, loaded %s and %s on %s from the embedded images\n",
         ag_kernel_spec(a)->name, ag_kernel_spec(b)->name, ag_context_arch(ctx));
  ag_context_destroy(ctx);
  return 0;
}
