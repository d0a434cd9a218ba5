/*
 * A slow disk for the nemesis suite (tests/e2e/test_nemesis.py): an LD_PRELOAD library whose
 * fsync() and fdatasync() sleep before doing the real call while a control file exists.
 *
 * Built by tests/e2e/nemesis_helpers.py:FsyncShim with
 *   gcc -shared -fPIC -O2 -DNEMESIS_CONTROL='"<path>"' -DNEMESIS_LOG='"<path>"' -o shim.so shim.c -ldl
 *
 * NEMESIS_CONTROL: while this file exists and holds a positive number of milliseconds, every
 *   fsync/fdatasync of a process that loaded the library sleeps that long first (the test
 *   turns the slow disk on and off by writing and deleting it; no environment variable is
 *   read, so the worker's allow-listed environment needs nothing but LD_PRELOAD).
 * NEMESIS_LOG: one line appended (O_APPEND, a single write, so lines of concurrent callers do
 *   not mix) when a slowed call starts and when it ends:
 *     begin|end <pid> <tid> <call> <fd> <ms> <monotonic ns> <file the fd names>
 *   so the test knows that a slow fsync is in progress, in which process, on which file.
 *
 * errno is preserved across the shim's own calls; the real call's result and errno are returned.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef NEMESIS_CONTROL
#error "compile with -DNEMESIS_CONTROL='\"/path/of/the/control/file\"'"
#endif
#ifndef NEMESIS_LOG
#error "compile with -DNEMESIS_LOG='\"/path/of/the/log\"'"
#endif

typedef int (*sync_fn)(int);

/* Milliseconds to sleep: the control file's number, 0 when it is absent or not positive. */
static long delay_ms(void) {
    int fd = open(NEMESIS_CONTROL, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    long ms = strtol(buf, NULL, 10);
    return ms > 0 ? ms : 0;
}

static void note(const char *what, const char *call, int fd, long ms) {
    char target[512];
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len < 0) {
        len = 0;
    }
    target[len] = '\0';
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    char line[768];
    int size = snprintf(line, sizeof line, "%s %d %ld %s %d %ld %lld %s\n", what, (int)getpid(), (long)syscall(SYS_gettid),
                        call, fd, ms, (long long)now.tv_sec * 1000000000LL + now.tv_nsec, target);
    if (size <= 0) {
        return;
    }
    if (size >= (int)sizeof line) {
        size = (int)sizeof line - 1;
        line[size - 1] = '\n';
    }
    int log = open(NEMESIS_LOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log < 0) {
        return;
    }
    ssize_t ignored = write(log, line, (size_t)size);
    (void)ignored;
    close(log);
}

static void slow_down(const char *call, int fd) {
    int saved = errno;
    long ms = delay_ms();
    if (ms > 0) {
        note("begin", call, fd, ms);
        struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&left, &left) == -1 && errno == EINTR) {
        }
        note("end", call, fd, ms);
    }
    errno = saved;
}

static int call_real(const char *name, sync_fn *cached, int fd) {
    if (*cached == NULL) {
        *cached = (sync_fn)dlsym(RTLD_NEXT, name);
        if (*cached == NULL) {
            errno = ENOSYS;
            return -1;
        }
    }
    return (*cached)(fd);
}

int fsync(int fd) {
    static sync_fn real_fsync;
    slow_down("fsync", fd);
    return call_real("fsync", &real_fsync, fd);
}

int fdatasync(int fd) {
    static sync_fn real_fdatasync;
    slow_down("fdatasync", fd);
    return call_real("fdatasync", &real_fdatasync, fd);
}
