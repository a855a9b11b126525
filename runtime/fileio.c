// SPDX-License-Identifier: BSD-3-Clause
/* fileio.c: the file operations the cache, the dump and the CLI need:
 * mkdir -p, an atomic write (temporary file in the same directory, fsync,
 * rename) so a reader never sees half a file, and the CLI's output write,
 * which never replaces a device node, FIFO or symbolic link. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
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

/* A temporary file next to `path`, created O_EXCL with mode 0666 so the
 * umask applies as it does to any new file. Its name keeps at most the first
 * 64 bytes of the basename, so a 255-byte basename still has room for the
 * ".tmp.XXXXXXXX" suffix. Returns the fd, or -1 with errno set. */
static int create_temp(const char *path, ag_buf *out_name) {
  const char *slash = strrchr(path, '/');
  size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
  size_t baselen = strlen(path + dirlen);
  if (baselen > 64) baselen = 64;
  static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (int attempt = 0; attempt < 100; attempt++) {
    uint8_t r[8];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15u ^ (uint64_t)getpid() << 32 ^
                   (uint64_t)attempt * 0xbf58476d1ce4e5b9u ^ (uint64_t)(uintptr_t)out_name;
      memcpy(r, &x, sizeof r);
    }
    char suffix[9];
    for (int i = 0; i < 8; i++) suffix[i] = digits[r[i] % 36];
    suffix[8] = '\0';
    out_name->len = 0;
    if (out_name->data) out_name->data[0] = '\0';
    ag_buf_printf(out_name, "%.*s%.*s.tmp.%s", (int)dirlen, path, (int)baselen, path + dirlen,
                  suffix);
    if (out_name->failed) {
      errno = ENOMEM;
      return -1;
    }
    int fd = open(out_name->data, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* Write every part to fd; false with errno on failure. */
static bool write_parts(int fd, const void *const *parts, const size_t *lens, size_t nparts) {
  for (size_t i = 0; i < nparts; i++) {
    const uint8_t *p = parts[i];
    size_t left = lens[i];
    while (left > 0) {
      ssize_t n = write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        return false;
      }
      p += n;
      left -= (size_t)n;
    }
  }
  return true;
}

/* The atomic write; `keep` (an existing regular target's stat) gives the new
 * file that target's mode and, where permitted, its owner. */
static ag_status write_atomic(const char *path, const void *const *parts, const size_t *lens,
                              size_t nparts, const struct stat *keep, ag_error *err) {
  ag_status st = AG_OK;
  ag_buf tmp;
  ag_buf_init(&tmp);
  int fd = create_temp(path, &tmp);
  if (fd < 0) {
    st = errno == ENOMEM ? ag_fail(err, AG_ERR_NOMEM, "out of memory")
                         : ag_fail(err, AG_ERR_IO, "cannot create a temporary file next to '%s': %s",
                                   path, strerror(errno));
    ag_buf_free(&tmp);
    return st;
  }
  if (keep) {
    /* Owner first: chown clears set-id bits, which the chmod then restores.
     * Only root may give a file away; anyone else keeps their own. */
    if (keep->st_uid != geteuid() || keep->st_gid != getegid())
      if (fchown(fd, keep->st_uid, keep->st_gid) != 0 && errno == EPERM)
        (void)!fchown(fd, (uid_t)-1, keep->st_gid);
    if (fchmod(fd, keep->st_mode & 07777) != 0) {
      st = ag_fail(err, AG_ERR_IO, "cannot set the mode of '%s': %s", tmp.data, strerror(errno));
      goto fail;
    }
  }
  if (!write_parts(fd, parts, lens, nparts) || fsync(fd) != 0) {
    st = ag_fail(err, AG_ERR_IO, "cannot write '%s': %s", tmp.data, strerror(errno));
    goto fail;
  }
  int rc = close(fd);
  fd = -1;
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
  if (fd >= 0) close(fd);
  unlink(tmp.data);
  ag_buf_free(&tmp);
  return st;
}

ag_status ag_write_atomic(const char *path, const void *const *parts, const size_t *lens,
                          size_t nparts, ag_error *err) {
  if (!path || !path[0]) return ag_fail(err, AG_ERR_IO, "cannot write a file with an empty name");
  return write_atomic(path, parts, lens, nparts, NULL, err);
}

/* Write into an existing FIFO or character device, never creating or
 * replacing anything. */
static ag_status write_through(const char *path, const void *data, size_t len, ag_error *err) {
  int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return ag_fail(err, AG_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat sb;
  ag_status st = AG_OK;
  if (fstat(fd, &sb) != 0 || !(S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode))) {
    /* Replaced between the lstat and the open: do not write into it. */
    st = ag_fail(err, AG_ERR_IO, "'%s' changed while being opened: not written", path);
  } else {
    const void *parts[] = {data};
    if (!write_parts(fd, parts, &len, 1))
      st = ag_fail(err, AG_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
  }
  if (close(fd) != 0 && st == AG_OK)
    st = ag_fail(err, AG_ERR_IO, "cannot close '%s': %s", path, strerror(errno));
  return st;
}

ag_status ag_write_output(const char *path, const void *data, size_t len, ag_error *err) {
  if (!path || !path[0]) return ag_fail(err, AG_ERR_IO, "cannot write a file with an empty name");
  struct stat lsb, sb;
  if (lstat(path, &lsb) != 0) {
    if (errno != ENOENT)
      return ag_fail(err, AG_ERR_IO, "cannot write '%s': %s", path, strerror(errno));
    const void *parts[] = {data};
    return write_atomic(path, parts, &len, 1, NULL, err);
  }
  if (S_ISLNK(lsb.st_mode) && stat(path, &sb) != 0)
    return ag_fail(err, AG_ERR_IO,
                   "'%s' is a symbolic link to a missing file (%s): not written, not replaced",
                   path, strerror(errno));
  if (!S_ISLNK(lsb.st_mode)) sb = lsb;
  if (S_ISFIFO(sb.st_mode) || S_ISCHR(sb.st_mode)) return write_through(path, data, len, err);
  if (S_ISDIR(sb.st_mode)) return ag_fail(err, AG_ERR_IO, "'%s' is a directory", path);
  if (!S_ISREG(sb.st_mode))
    return ag_fail(err, AG_ERR_IO, "'%s' is a %s: refusing to write into it or replace it", path,
                   S_ISBLK(sb.st_mode) ? "block device" : "socket or special file");
  /* A regular file, maybe through a symbolic link: replace the file the link
   * names, so the link stays. */
  char *real = S_ISLNK(lsb.st_mode) ? realpath(path, NULL) : NULL;
  if (S_ISLNK(lsb.st_mode) && !real)
    return ag_fail(err, AG_ERR_IO, "cannot resolve '%s': %s", path, strerror(errno));
  const void *parts[] = {data};
  ag_status st = write_atomic(real ? real : path, parts, &len, 1, &sb, err);
  free(real);
  return st;
}
