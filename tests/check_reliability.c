/* check_reliability.c: regressions for issue 22 (reliability, second
 * round), CPU side: output targets that are not plain files, file modes and
 * long names, the cache against FIFOs, huge or foreign entries and stale
 * temporaries, numbers fp32 cannot hold, source names, C API misuse and the
 * command line's own output. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attngen.h"
#include "runtime.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------ */

/* The CLI binary's absolute path (ATTNGEN_BIN, else ../build/attngen). */
static const char *cli(void) {
  static char bin[PATH_MAX];
  const char *rel = getenv("ATTNGEN_BIN");
  ck_assert_ptr_nonnull(realpath(rel ? rel : "../build/attngen", bin));
  return bin;
}

/* The repository root's absolute path (tests run from tests/). */
static const char *root(void) {
  static char dir[PATH_MAX];
  ck_assert_ptr_nonnull(realpath("..", dir));
  return dir;
}

/* Run a shell command line; its exit status (-1 when killed). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  ck_assert_int_lt(n, (int)sizeof cmd);
  int status = system(cmd);
  return status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define SPEC "specs/ads_block64_d64_fp16.yaml"

/* ---- row 1: output targets that are not regular files -------------------- */

START_TEST(output_fifo_written_through) {
  char *dir = ag_test_mkdtemp("ag-rel-out");
  char fifo[PATH_MAX], got[PATH_MAX];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  snprintf(got, sizeof got, "%s/got", dir);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  /* A reader on the FIFO in the background; emit writes into it. */
  int rc = sh("cd %s && (cat %s >%s &) && timeout 20 %s emit " SPEC " -o %s; s=$?; sleep 0.2; "
              "exit $s",
              root(), fifo, got, cli(), fifo);
  ck_assert_int_eq(rc, 0);
  struct stat sb;
  ck_assert_int_eq(lstat(fifo, &sb), 0);
  ck_assert_msg(S_ISFIFO(sb.st_mode), "the FIFO was replaced");
  for (int i = 0; i < 50 && (stat(got, &sb) != 0 || sb.st_size == 0); i++) usleep(100000);
  char *text = ag_test_slurp(got, NULL);
  ck_assert_ptr_nonnull(text);
  ck_assert_ptr_nonnull(strstr(text, "__global__"));
  free(text);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(output_device_and_symlink_kept) {
  char *dir = ag_test_mkdtemp("ag-rel-out");
  char node[PATH_MAX], link[PATH_MAX], file[PATH_MAX], flink[PATH_MAX], dangling[PATH_MAX];
  snprintf(node, sizeof node, "%s/null", dir);
  snprintf(link, sizeof link, "%s/link", dir);
  snprintf(file, sizeof file, "%s/file", dir);
  snprintf(flink, sizeof flink, "%s/flink", dir);
  snprintf(dangling, sizeof dangling, "%s/dangling", dir);
  struct stat sb;
  /* A device node of our own where allowed (root), else /dev/null itself
   * through a link only. */
  bool have_node = mknod(node, S_IFCHR | 0666, makedev(1, 3)) == 0;
  if (have_node) {
    ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), node), 0);
    ck_assert_int_eq(lstat(node, &sb), 0);
    ck_assert_msg(S_ISCHR(sb.st_mode), "the device node was replaced");
  }
  ck_assert_int_eq(symlink("/dev/null", link), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), link), 0);
  ck_assert_int_eq(lstat(link, &sb), 0);
  ck_assert_msg(S_ISLNK(sb.st_mode), "the symbolic link was replaced");
  ck_assert_int_eq(stat("/dev/null", &sb), 0);
  ck_assert(S_ISCHR(sb.st_mode));
  /* A link to a regular file: the file gets the text, the link stays. */
  ag_test_spit(file, "old\n", 4);
  ck_assert_int_eq(symlink(file, flink), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), flink), 0);
  ck_assert_int_eq(lstat(flink, &sb), 0);
  ck_assert(S_ISLNK(sb.st_mode));
  char *text = ag_test_slurp(file, NULL);
  ck_assert_ptr_nonnull(strstr(text, "__global__"));
  free(text);
  /* A dangling link and a directory are refused, with a message. */
  ck_assert_int_eq(symlink("/nonexistent/x", dangling), 0);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s 2>%s/err", root(), cli(), dangling, dir), 1);
  ck_assert_int_eq(lstat(dangling, &sb), 0);
  ck_assert(S_ISLNK(sb.st_mode));
  char errpath[PATH_MAX];
  snprintf(errpath, sizeof errpath, "%s/err", dir);
  text = ag_test_slurp(errpath, NULL);
  ck_assert_msg(strstr(text, "symbolic link to a missing file"), "got: %s", text);
  free(text);
  ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s 2>/dev/null", root(), cli(), dir), 1);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

/* ---- row 7: modes and long names ----------------------------------------- */

START_TEST(output_mode_umask_and_existing) {
  char *dir = ag_test_mkdtemp("ag-rel-mode");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/out.cu", dir);
  struct stat sb;
  ck_assert_int_eq(sh("cd %s && umask 022 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0644);
  unlink(path);
  ck_assert_int_eq(sh("cd %s && umask 077 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0600);
  /* An existing file keeps its mode (and, as root, its owner). */
  ck_assert_int_eq(chmod(path, 0640), 0);
  bool root_user = geteuid() == 0;
  if (root_user) ck_assert_int_eq(chown(path, 65534, 65534), 0);
  ck_assert_int_eq(sh("cd %s && umask 077 && %s emit " SPEC " -o %s", root(), cli(), path), 0);
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 0777, 0640);
  if (root_user) {
    ck_assert_int_eq(sb.st_uid, 65534);
    ck_assert_int_eq(sb.st_gid, 65534);
  }
  ck_assert_int_gt(sb.st_size, 100);
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

START_TEST(output_long_basename) {
  char *dir = ag_test_mkdtemp("ag-rel-long");
  for (int n = 245; n <= 255; n += 5) {
    char path[PATH_MAX];
    int k = snprintf(path, sizeof path, "%s/", dir);
    memset(path + k, 'x', (size_t)n - 3);
    strcpy(path + k + n - 3, ".cu");
    ck_assert_int_eq(sh("cd %s && %s emit " SPEC " -o %s", root(), cli(), path), 0);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_gt(sb.st_size, 100);
    /* Through the runtime's writer too. */
    const void *parts[] = {"abc"};
    size_t lens[] = {3};
    ck_assert_int_eq(ag_write_atomic(path, parts, lens, 1, NULL), AG_OK);
  }
  ag_test_remove_tree(dir);
  free(dir);
}
END_TEST

Suite *reliability_suite(void) {
  Suite *s = suite_create("reliability");
  TCase *tc = tcase_create("output");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, output_fifo_written_through);
  tcase_add_test(tc, output_device_and_symlink_kept);
  tcase_add_test(tc, output_mode_umask_and_existing);
  tcase_add_test(tc, output_long_basename);
  suite_add_tcase(s, tc);
  return s;
}
