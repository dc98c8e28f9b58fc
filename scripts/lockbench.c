/* Lock-path benchmark used by scripts/lockbench.sh.
 * Usage: lockbench DIR N SECONDS [METRIC]
 * Prints "<metric> <value>" lines:
 *   stat_ns (stat of an unchanged file), open_close_ns, flock_pair_ns,
 *   fcntl_pair_ns, lease_cycle_ns, fsync_cycle_ns, renew_rename_ns (write a
 *   64-byte temporary file and rename it over a lease another process holds;
 *   not printed where rename fails) (single runs; the script takes medians
 *   over repeated runs)
 *   contend2_acq_s, contend2_worst_us, contend8_acq_s, contend8_worst_us
 *   parallel1_pairs_s, parallel2_pairs_s (flock pairs per second of one
 *   process bound to CPU 0 looping on a file of its own, and of two
 *   processes bound to CPUs 0 and 1 each looping on its own file)
 * With METRIC, runs only that one (the script counts the FUSE requests of
 * each operation that way). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void die(const char *what) { perror(what); exit(1); }

static void setlk(int fd, short type) {
    struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0 };
    if (fcntl(fd, F_SETLKW, &fl)) die("fcntl");
}

static void contend(int procs, double seconds, const char *metric) {
    int pipes[2];
    if (pipe(pipes)) die("pipe");
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            int fd = open("C", O_RDWR | O_CREAT, 0644);
            if (fd < 0) die("open C");
            long n = 0;
            double worst = 0, end = now_ns() + seconds * 1e9;
            while (now_ns() < end) {
                double t0 = now_ns();
                if (flock(fd, LOCK_EX)) die("flock");
                double w = now_ns() - t0;
                if (w > worst) worst = w;
                n++;
                if (flock(fd, LOCK_UN)) die("unlock");
            }
            double out[2] = { (double)n, worst };
            if (write(pipes[1], out, sizeof out) != sizeof out) die("write");
            _exit(0);
        }
    }
    close(pipes[1]);
    double total = 0, worst = 0, out[2];
    for (int p = 0; p < procs; p++) {
        if (read(pipes[0], out, sizeof out) != sizeof out) die("read");
        total += out[0];
        if (out[1] > worst) worst = out[1];
    }
    while (wait(NULL) > 0) {}
    printf("%s_acq_s %.0f\n%s_worst_us %.0f\n", metric, total / seconds, metric, worst / 1000);
}

/* procs processes, process p bound to CPU p, each looping flock pairs on
 * its own file P<p> for `seconds`; prints the pairs per second of all. */
static void parallel(int procs, double seconds, const char *metric) {
    int pipes[2];
    if (pipe(pipes)) die("pipe");
    for (int p = 0; p < procs; p++) {
        if (fork() == 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(p, &set);
            if (sched_setaffinity(0, sizeof set, &set)) die("sched_setaffinity");
            char name[16];
            snprintf(name, sizeof name, "P%d", p);
            int fd = open(name, O_RDWR | O_CREAT, 0644);
            if (fd < 0) die("open P");
            if (flock(fd, LOCK_EX) || flock(fd, LOCK_UN)) die("flock");
            double n = 0, end = now_ns() + seconds * 1e9;
            while (now_ns() < end) {
                if (flock(fd, LOCK_EX) || flock(fd, LOCK_UN)) die("flock");
                n++;
            }
            if (write(pipes[1], &n, sizeof n) != sizeof n) die("write");
            _exit(0);
        }
    }
    close(pipes[1]);
    double total = 0, n;
    for (int p = 0; p < procs; p++) {
        if (read(pipes[0], &n, sizeof n) != sizeof n) die("read");
        total += n;
    }
    close(pipes[0]);
    while (wait(NULL) > 0) {}
    printf("%s_pairs_s %.0f\n", metric, total / seconds);
}

/* n times: open L, take LOCK_EX, write buf, (fsync,) close; print ns/cycle. */
static void lease_cycle(int n, const char *buf, size_t len, int do_fsync, const char *metric) {
    double t = now_ns();
    for (int i = 0; i < n; i++) {
        int f = open("L", O_RDWR);
        if (f < 0) die("open");
        if (flock(f, LOCK_EX)) die("flock");
        if (pwrite(f, buf, len, 0) != (ssize_t)len) die("pwrite");
        if (do_fsync && fsync(f)) die("fsync");
        close(f);
    }
    printf("%s %.0f\n", metric, (now_ns() - t) / n);
}

/* n times: write a 64-byte temporary file and rename it over R, which a
 * child process holds with flock(LOCK_EX) all along. */
static void renew_rename(int n, const char *buf, size_t len) {
    int fd = open("R", O_RDWR | O_CREAT, 0644);
    if (fd < 0) die("open R");
    int ready[2], done[2];
    if (pipe(ready) || pipe(done)) die("pipe");
    pid_t child = fork();
    if (child == 0) {
        char c;
        close(done[1]);
        if (flock(fd, LOCK_EX)) die("flock R");
        if (write(ready[1], "r", 1) != 1) die("write");
        if (read(done[0], &c, 1) < 0) die("read");
        _exit(0);
    }
    char c;
    close(done[0]);
    if (read(ready[0], &c, 1) != 1) die("holder");
    int ok = 1;
    double t = now_ns();
    for (int i = 0; i < n && ok; i++) {
        /* A fresh name each time (the minimal filesystem has no unlink,
         * truncate or rename: there the metric is left out). */
        int f = open("renew.tmp", O_WRONLY | O_CREAT | O_EXCL, 0644);
        ok = f >= 0 && write(f, buf, len) == (ssize_t)len;
        if (f >= 0) close(f);
        ok = ok && rename("renew.tmp", "R") == 0;
    }
    double per = (now_ns() - t) / n;
    close(done[1]);
    waitpid(child, NULL, 0);
    close(fd);
    if (ok) printf("renew_rename_ns %.0f\n", per);
}

static const char *only;

static int want(const char *metric) { return !only || !strcmp(only, metric); }

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) { fprintf(stderr, "usage: lockbench DIR N SECONDS [METRIC]\n"); return 2; }
    if (chdir(argv[1])) die("chdir");
    int n = atoi(argv[2]);
    double secs = atof(argv[3]);
    only = argc == 5 ? argv[4] : NULL;
    char buf[64];
    memset(buf, 'x', sizeof buf);

    int fd = open("L", O_RDWR | O_CREAT, 0644);
    if (fd < 0) die("open L");
    int s = open("S", O_RDWR | O_CREAT, 0644);
    if (s < 0 || close(s)) die("open S");
    struct stat st;
    /* Files are measured as they usually are, older than a second (leasefs
     * has the kernel cache the names of files only from then on). */
    if (stat("S", &st)) die("stat");
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    double age = (wall.tv_sec - st.st_mtim.tv_sec) + (wall.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
    if (age < 1.2) usleep((useconds_t)((1.2 - age) * 1e6));
    /* Each measured loop starts with one untimed round, so every column
     * starts with the names looked up once. */
    double t;
    if (want("stat_ns")) {
        if (stat("S", &st)) die("stat");
        t = now_ns();
        for (int i = 0; i < n; i++)
            if (stat("S", &st)) die("stat");
        printf("stat_ns %.0f\n", (now_ns() - t) / n);
    }
    if (want("open_close_ns")) {
        t = now_ns();
        for (int i = 0; i < n; i++) {
            int f = open("S", O_RDONLY);
            if (f < 0 || close(f)) die("open S");
        }
        printf("open_close_ns %.0f\n", (now_ns() - t) / n);
    }
    if (want("flock_pair_ns")) {
        t = now_ns();
        for (int i = 0; i < n; i++) {
            if (flock(fd, LOCK_EX) || flock(fd, LOCK_UN)) die("flock");
        }
        printf("flock_pair_ns %.0f\n", (now_ns() - t) / n);
    }
    if (want("fcntl_pair_ns")) {
        t = now_ns();
        for (int i = 0; i < n; i++) {
            setlk(fd, F_WRLCK);
            setlk(fd, F_UNLCK);
        }
        printf("fcntl_pair_ns %.0f\n", (now_ns() - t) / n);
    }
    close(fd);

    if (want("lease_cycle_ns")) lease_cycle(n, buf, sizeof buf, 0, "lease_cycle_ns");
    /* The same with an fsync of the lease before unlocking. */
    if (want("fsync_cycle_ns")) lease_cycle(n, buf, sizeof buf, 1, "fsync_cycle_ns");

    if (want("renew_rename_ns")) renew_rename(n, buf, sizeof buf);

    if (want("contend2_acq_s")) contend(2, secs, "contend2");
    if (want("contend8_acq_s")) contend(8, secs, "contend8");
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2) {
        if (want("parallel1_pairs_s")) parallel(1, secs, "parallel1");
        if (want("parallel2_pairs_s")) parallel(2, secs, "parallel2");
    }
    return 0;
}
