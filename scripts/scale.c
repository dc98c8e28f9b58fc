/* Lease-population helper used by scripts/scalebench.sh.
 *
 *   scale create DIR N DIRS     create N leases: open(O_CREAT|O_EXCL), flock,
 *                               write a 14-byte JSON body, unlock, close; in
 *                               DIRS subdirectories d0..d{DIRS-1} (DIRS=1: all
 *                               in DIR itself). Prints create_ns (per lease).
 *   scale ops DIR N DIRS OPS    time OPS of each operation on existing leases
 *                               picked at random: lookup (stat of a name the
 *                               kernel holds no valid entry of: distinct
 *                               names, after every entry expired; a LOOKUP
 *                               and a GETATTR), and, on a name just looked
 *                               up (untimed), stat (a GETATTR), open+close,
 *                               lease cycle (open, LOCK_EX|LOCK_NB, write
 *                               14 B, close); flock pair on an open
 *                               descriptor. The same requests at every N.
 *                               Prints "<metric>_ns <median of 5 batches>".
 *   scale churn DIR N           N cycles of create/lock/write/unlock/close/
 *                               unlink of unique names. Prints churn_ns.
 *   scale probe FILE GAP OUT    flock pairs (LOCK_EX, LOCK_UN) on FILE, GAP
 *                               µs apart (0: back to back), until SIGTERM;
 *                               then writes
 *                               "start_ns duration_ns" per pair to OUT
 *                               (CLOCK_MONOTONIC, as Python's monotonic_ns).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char BODY[] = "{\"holder\":42}\n";

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "scale: %s %s: ", what, path ? path : "");
    perror(NULL);
    exit(1);
}

static void name(char *buf, size_t len, const char *dir, long i, long dirs) {
    if (dirs > 1)
        snprintf(buf, len, "%s/d%ld/lease-%ld.json", dir, i % dirs, i);
    else
        snprintf(buf, len, "%s/lease-%ld.json", dir, i);
}

static void cycle(const char *path, int flags) {
    int fd = open(path, O_RDWR | flags, 0644);
    if (fd < 0) die("open", path);
    if (flock(fd, LOCK_EX | LOCK_NB)) die("flock", path);
    if (pwrite(fd, BODY, sizeof BODY - 1, 0) != (ssize_t)(sizeof BODY - 1)) die("write", path);
    if (flags & O_EXCL && flock(fd, LOCK_UN)) die("unlock", path);
    if (close(fd)) die("close", path);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static unsigned long long rng = 88172645463325252ULL;
static long pick(long n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (long)(rng % (unsigned long long)n);
}

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

static int probe(const char *file, long gap_us, const char *out) {
    int fd = open(file, O_RDWR | O_CREAT, 0644);
    if (fd < 0) die("open", file);
    signal(SIGTERM, on_term);
    size_t cap = 1 << 20, n = 0;
    double *t = malloc(cap * 2 * sizeof *t);
    if (!t) die("malloc", NULL);
    /* Ready: the caller waits for this line before it starts what it measures. */
    printf("ready 1\n");
    fflush(stdout);
    while (!stop) {
        double t0 = now_ns();
        if (flock(fd, LOCK_EX) || flock(fd, LOCK_UN)) {
            if (stop) break;
            die("flock", file);
        }
        if (n == cap) {
            cap *= 2;
            if (!(t = realloc(t, cap * 2 * sizeof *t))) die("realloc", NULL);
        }
        t[2 * n] = t0;
        t[2 * n + 1] = now_ns() - t0;
        n++;
        if (gap_us) usleep(gap_us);
    }
    FILE *f = fopen(out, "w");
    if (!f) die("fopen", out);
    for (size_t i = 0; i < n; i++) fprintf(f, "%.0f %.0f\n", t[2 * i], t[2 * i + 1]);
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    char path[4096];
    if (argc < 4) {
        fprintf(stderr, "usage: scale create|ops|churn|probe DIR N [DIRS [OPS]]\n");
        return 2;
    }
    const char *mode = argv[1], *dir = argv[2];
    /* SCALE_SEED picks other random leases (the default picks the same
     * ones on every run). */
    if (getenv("SCALE_SEED")) rng += strtoull(getenv("SCALE_SEED"), NULL, 10) * 0x9E3779B97F4A7C15ULL;
    long n = atol(argv[3]);
    long dirs = argc > 4 ? atol(argv[4]) : 1;
    if (!strcmp(mode, "probe")) {
        return probe(dir, n, argc > 4 ? argv[4] : "/dev/null");
    } else if (!strcmp(mode, "create")) {
        for (long d = 0; dirs > 1 && d < dirs; d++) {
            snprintf(path, sizeof path, "%s/d%ld", dir, d);
            if (mkdir(path, 0755)) die("mkdir", path);
        }
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            name(path, sizeof path, dir, i, dirs);
            cycle(path, O_CREAT | O_EXCL);
        }
        printf("create_ns %.0f\n", (now_ns() - t0) / n);
    } else if (!strcmp(mode, "churn")) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/churn-%d-%ld", dir, getpid(), i);
            cycle(path, O_CREAT | O_EXCL);
            if (unlink(path)) die("unlink", path);
        }
        printf("churn_ns %.0f\n", (now_ns() - t0) / n);
    } else if (!strcmp(mode, "ops")) {
        long ops = argc > 5 ? atol(argv[5]) : 2000;
        const char *metrics[] = { "lookup", "stat", "open_close", "lock_pair", "lease_cycle" };
        /* Distinct names for the lookups of one batch: a partial shuffle. */
        long *perm = malloc(n * sizeof *perm);
        if (!perm) die("malloc", NULL);
        for (long i = 0; i < n; i++) perm[i] = i;
        for (int m = 0; m < 5; m++) {
            double batch[5];
            for (int b = 0; b < 5; b++) {
                double spent = 0;
                long count = m == 0 && ops > n ? n : ops;
                if (m == 0) {
                    for (long k = 0; k < count; k++) {
                        long j = k + pick(n - k), t = perm[k];
                        perm[k] = perm[j];
                        perm[j] = t;
                    }
                    /* Every entry the kernel was given expires after 1 s. */
                    usleep(1200000);
                }
                for (long k = 0; k < count; k++) {
                    name(path, sizeof path, dir, m == 0 ? perm[k] : pick(n), dirs);
                    struct stat st;
                    int fd = -1;
                    if (m == 3 && (fd = open(path, O_RDONLY)) < 0) die("open", path);
                    if (m != 0 && m != 3 && stat(path, &st)) die("stat", path);
                    double t0 = now_ns();
                    switch (m) {
                    case 0:
                    case 1:
                        if (stat(path, &st)) die("stat", path);
                        break;
                    case 2:
                        if ((fd = open(path, O_RDONLY)) < 0) die("open", path);
                        close(fd);
                        break;
                    case 3:
                        /* The descriptor is opened outside the timed pair. */
                        if (flock(fd, LOCK_EX) || flock(fd, LOCK_UN)) die("flock", path);
                        break;
                    default:
                        cycle(path, 0);
                    }
                    spent += now_ns() - t0;
                    if (m == 3) close(fd);
                }
                batch[b] = spent / count;
            }
            qsort(batch, 5, sizeof batch[0], cmp);
            printf("%s_ns %.0f\n", metrics[m], batch[2]);
        }
        free(perm);
    } else {
        fprintf(stderr, "scale: unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
