/* Filesystem micro-benchmark used by scripts/bench.sh.
 * Usage: fsbench DIR N
 * Prints "<op> <nanoseconds per operation>" for each operation, run in DIR. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void die(const char *what) { perror(what); exit(1); }

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: fsbench DIR N\n"); return 2; }
    if (chdir(argv[1])) die("chdir");
    int n = atoi(argv[2]);
    char name[64], name2[64], buf[64];
    memset(buf, 'x', sizeof buf);
    double t;

    t = now_ns();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "f%d", i);
        int fd = open(name, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) die("create");
        close(fd);
    }
    printf("create %.0f\n", (now_ns() - t) / n);

    struct stat st;
    t = now_ns();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "f%d", i);
        if (stat(name, &st)) die("stat");
    }
    printf("stat %.0f\n", (now_ns() - t) / n);

    t = now_ns();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "f%d", i);
        int fd = open(name, O_RDONLY);
        if (fd < 0) die("open");
        close(fd);
    }
    printf("open_close %.0f\n", (now_ns() - t) / n);

    int fd = open("data", O_CREAT | O_RDWR, 0644);
    if (fd < 0) die("open data");
    t = now_ns();
    for (int i = 0; i < n; i++)
        if (pwrite(fd, buf, sizeof buf, (off_t)(i % 64) * 64) != sizeof buf) die("pwrite");
    printf("write_64B %.0f\n", (now_ns() - t) / n);

    t = now_ns();
    for (int i = 0; i < n; i++)
        if (pread(fd, buf, sizeof buf, (off_t)(i % 64) * 64) != sizeof buf) die("pread");
    printf("read_64B %.0f\n", (now_ns() - t) / n);
    close(fd);

    t = now_ns();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "f%d", i);
        snprintf(name2, sizeof name2, "g%d", i);
        if (rename(name, name2)) die("rename");
    }
    printf("rename %.0f\n", (now_ns() - t) / n);

    t = now_ns();
    for (int i = 0; i < n; i++) {
        snprintf(name2, sizeof name2, "g%d", i);
        if (unlink(name2)) die("unlink");
    }
    printf("unlink %.0f\n", (now_ns() - t) / n);
    unlink("data");

    if (mkdir("big", 0755)) die("mkdir");
    for (int i = 0; i < 10000; i++) {
        snprintf(name, sizeof name, "big/e%d", i);
        int f = open(name, O_CREAT | O_WRONLY, 0644);
        if (f < 0) die("create big");
        close(f);
    }
    int reps = 5;
    t = now_ns();
    for (int r = 0; r < reps; r++) {
        DIR *d = opendir("big");
        if (!d) die("opendir");
        int count = 0;
        while (readdir(d)) count++;
        closedir(d);
        if (count != 10002) { fprintf(stderr, "readdir saw %d entries\n", count); return 1; }
    }
    printf("readdir_10k %.0f\n", (now_ns() - t) / reps);
    for (int i = 0; i < 10000; i++) {
        snprintf(name, sizeof name, "big/e%d", i);
        unlink(name);
    }
    rmdir("big");
    return 0;
}
