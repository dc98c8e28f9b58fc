/* Parked-waiter load used by scripts/waitbench.sh.
 * Usage: waitbench DIR FILES PER_FILE
 * Starts FILES*PER_FILE threads (small stacks), thread k blocking in
 * flock(LOCK_EX) on DIR/W<k % FILES> through a descriptor of its own,
 * prints "parked" once every thread has started its call, then waits
 * (the script holds the files first and kills this process at the end). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static const char *dir;
static int files;

static void *wait_one(void *arg) {
    long k = (long)arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/W%ld", dir, k % files);
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror("open"); exit(1); }
    flock(fd, LOCK_EX);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: waitbench DIR FILES PER_FILE\n"); return 2; }
    dir = argv[1];
    files = atoi(argv[2]);
    long n = (long)files * atol(argv[3]);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (long k = 0; k < n; k++) {
        pthread_t t;
        if (pthread_create(&t, &attr, wait_one, (void *)k)) { perror("pthread_create"); return 1; }
    }
    printf("parked\n");
    fflush(stdout);
    pause();
    return 0;
}
