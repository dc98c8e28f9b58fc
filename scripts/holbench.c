/* Head-of-line benchmark used by scripts/holbench.sh.
 * Usage: holbench DIR N
 * Times N flock pairs (LOCK_EX, LOCK_UN) on DIR/lease, first alone, then
 * while a second process loops write(4 KiB) + fsync on DIR/busy.
 * Prints "<metric> <value>" lines (µs): alone_p50_us, alone_p99_us,
 * alone_max_us, fsync_p50_us, fsync_p99_us, fsync_max_us, and
 * fsyncs_per_s (the other process's rate meanwhile). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what) { perror(what); exit(1); }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pairs(int fd, int n, const char *name) {
    double *t = malloc(sizeof(double) * n);
    if (!t) die("malloc");
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (flock(fd, LOCK_EX)) die("flock");
        if (flock(fd, LOCK_UN)) die("flock un");
        t[i] = now_us() - t0;
    }
    qsort(t, n, sizeof(double), cmp);
    printf("%s_p50_us %.1f\n%s_p99_us %.1f\n%s_max_us %.1f\n", name, t[n / 2], name, t[n * 99 / 100], name, t[n - 1]);
    free(t);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: holbench DIR N\n"); return 2; }
    if (chdir(argv[1])) die("chdir");
    int n = atoi(argv[2]);
    int fd = open("lease", O_RDWR | O_CREAT, 0644);
    if (fd < 0) die("open lease");
    pairs(fd, n, "alone");
    long *count = mmap(NULL, sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (count == MAP_FAILED) die("mmap");
    *count = 0;
    pid_t busy = fork();
    if (busy < 0) die("fork");
    if (busy == 0) {
        char buf[4096];
        memset(buf, 'x', sizeof buf);
        int b = open("busy", O_RDWR | O_CREAT, 0644);
        if (b < 0) die("open busy");
        for (long i = 0;; i++) {
            if (pwrite(b, buf, sizeof buf, (i % 256) * sizeof buf) != sizeof buf) die("write busy");
            if (fsync(b)) die("fsync busy");
            __atomic_add_fetch(count, 1, __ATOMIC_RELAXED);
        }
    }
    /* Let the fsync loop get going (and notice if it cannot). */
    while (__atomic_load_n(count, __ATOMIC_RELAXED) < 20) {
        if (waitpid(busy, NULL, WNOHANG) == busy) { fprintf(stderr, "holbench: the write+fsync loop failed\n"); return 1; }
        usleep(1000);
    }
    long c0 = __atomic_load_n(count, __ATOMIC_RELAXED);
    double t0 = now_us();
    pairs(fd, n, "fsync");
    double secs = (now_us() - t0) / 1e6;
    long c1 = __atomic_load_n(count, __ATOMIC_RELAXED);
    kill(busy, SIGKILL);
    waitpid(busy, NULL, 0);
    printf("fsyncs_per_s %.0f\n", (c1 - c0) / secs);
    return 0;
}
