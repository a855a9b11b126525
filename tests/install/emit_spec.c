/* emit_spec.c: the program tools/test_install.sh builds against an
 * installed attngen with nothing but `pkg-config --cflags --libs attngen`.
 * It parses the spec named on the command line and emits its CUDA C (no GPU,
 * no driver), printing the kernel's name and the source's size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <attngen.h>

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: emit_spec SPEC\n");
    return 2;
  }
  ag_error err = {0};
  ag_spec spec;
  char *source = NULL, name[AG_KERNEL_NAME_MAX];
  if (ag_spec_load_file(argv[1], &spec, &err) != AG_OK ||
      ag_emit(&spec, &source, name, &err) != AG_OK) {
    fprintf(stderr, "%s\n", err.message ? err.message : ag_strerror(err.code));
    ag_error_clear(&err);
    return 1;
  }
  int ok = strstr(source, "__global__") != NULL;
  printf("%s: %s, %zu bytes of CUDA C%s\n", spec.name, name, strlen(source),
         ok ? "" : " (no __global__ in it)");
  free(source);
  return ok ? 0 : 1;
}
