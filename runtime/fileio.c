/* fileio.c: the two file operations the cache and the dump need: mkdir -p,
 * and an atomic write (temporary file in the same directory, fsync, rename)
 * so a reader never sees half a file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime.h"

ag_status ag_mkdir_p(const char *path, unsigned mode, ag_error *err) {
  ag_status st = AG_OK;
  if (!path || !path[0])
    return ag_fail(err, AG_ERR_IO, "cannot create a directory with an empty name");
  char *p = strdup(path);
  if (!p) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  size_t len = strlen(p);
  while (len > 1 && p[len - 1] == '/') p[--len] = '\0';
  /* Walk the components left to right; each prefix must end up a directory. */
  for (char *s = p + 1;; s++) {
    bool last = *s == '\0';
    if (*s != '/' && !last) continue;
    *s = '\0';
    if (mkdir(p, (mode_t)mode) != 0) {
      int e = errno; /* an existing directory is fine, whatever mkdir said */
      struct stat sb;
      if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st = ag_fail(err, AG_ERR_IO, "cannot create directory '%s': %s", p,
                     e == EEXIST ? "not a directory" : strerror(e));
        goto fail;
      }
    }
    if (last) break;
    *s = '/';
  }
fail:
  free(p);
  return st;
}

ag_status ag_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                          size_t nparts, ag_error *err) {
  ag_status st = AG_OK;
  FILE *f = NULL;
  int fd = -1;
  bool created = false;
  ag_buf tmp;
  ag_buf_init(&tmp);
  ag_buf_printf(&tmp, "%s.tmp.XXXXXX", path);
  if (tmp.failed) {
    st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
    goto fail;
  }
  fd = mkstemp(tmp.data);
  if (fd < 0) {
    st = ag_fail(err, AG_ERR_IO, "cannot create a temporary file next to '%s': %s", path,
                 strerror(errno));
    goto fail;
  }
  created = true;
  f = fdopen(fd, "wb");
  if (!f) {
    st = ag_fail(err, AG_ERR_IO, "cannot open '%s': %s", tmp.data, strerror(errno));
    goto fail;
  }
  fd = -1; /* owned by f now */
  for (size_t i = 0; i < nparts; i++) {
    if (lens[i] && fwrite(parts[i], 1, lens[i], f) != lens[i]) {
      st = ag_fail(err, AG_ERR_IO, "cannot write '%s': %s", tmp.data, strerror(errno));
      goto fail;
    }
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
    st = ag_fail(err, AG_ERR_IO, "cannot write '%s': %s", tmp.data, strerror(errno));
    goto fail;
  }
  int rc = fclose(f);
  f = NULL;
  if (rc != 0) {
    st = ag_fail(err, AG_ERR_IO, "cannot close '%s': %s", tmp.data, strerror(errno));
    goto fail;
  }
  if (rename(tmp.data, path) != 0) {
    st = ag_fail(err, AG_ERR_IO, "cannot rename '%s' to '%s': %s", tmp.data, path, strerror(errno));
    goto fail;
  }
  ag_buf_free(&tmp);
  return AG_OK;
fail:
  if (f) fclose(f);
  if (fd >= 0) close(fd);
  if (created) unlink(tmp.data);
  ag_buf_free(&tmp);
  return st;
}
