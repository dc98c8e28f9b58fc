/* LD_PRELOAD shim that forces one interleaving between two dotlock tools.
 *
 * Only calls on the basename in INTERLEAVE_TARGET are affected:
 *   INTERLEAVE_SIGNAL_AT_UNLINK=F   create F when unlink(target) is entered
 *   INTERLEAVE_WAIT_AT_UNLINK=F     then wait (up to 20 s) until F exists
 *   INTERLEAVE_SIGNAL_AFTER_LINK=F  create F after link(_, target) succeeded
 *   INTERLEAVE_LOG=F                append "unlink <errno>" / "link <errno>"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_target(const char *path) {
    const char *t = getenv("INTERLEAVE_TARGET");
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return t && strcmp(base, t) == 0;
}

static void touch(const char *var) {
    const char *f = getenv(var);
    if (f) close(open(f, O_CREAT | O_WRONLY, 0644));
}

static void await(const char *var) {
    const char *f = getenv(var);
    for (int i = 0; f && i < 2000 && access(f, F_OK) != 0; i++) usleep(10000);
}

static void log_result(const char *op, int rc, int err) {
    const char *f = getenv("INTERLEAVE_LOG");
    if (!f) return;
    FILE *out = fopen(f, "a");
    if (!out) return;
    fprintf(out, "%d %s %d\n", (int)getpid(), op, rc == 0 ? 0 : err);
    fclose(out);
}

int unlink(const char *path) {
    static int (*real)(const char *);
    if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "unlink");
    if (!is_target(path)) return real(path);
    touch("INTERLEAVE_SIGNAL_AT_UNLINK");
    await("INTERLEAVE_WAIT_AT_UNLINK");
    int rc = real(path);
    int err = errno;
    log_result("unlink", rc, err);
    errno = err;
    return rc;
}

int link(const char *from, const char *to) {
    static int (*real)(const char *, const char *);
    if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "link");
    int rc = real(from, to);
    int err = errno;
    if (is_target(to)) {
        log_result("link", rc, err);
        if (rc == 0) touch("INTERLEAVE_SIGNAL_AFTER_LINK");
    }
    errno = err;
    return rc;
}
