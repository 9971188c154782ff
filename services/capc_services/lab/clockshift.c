/* A process whose wall clock is off by CAPC_CLOCK_OFFSET_S seconds (LD_PRELOAD; see clock.py).
 *
 * Only the wall clock moves: clock_gettime(CLOCK_REALTIME*), gettimeofday() and time() return the real time
 * plus the offset, so everything that reads the date (Python's time.time(), TLS certificate checks, log
 * stamps) sees the skewed clock. The monotonic clocks, sleeps and timed waits are the kernel's own, untouched:
 * libfaketime also shifts those, and Python's sleeps and lock timeouts then fail (EINVAL) or hang. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long offset(void) {
    static long seconds = 0;
    static int read = 0;
    if (!read) {
        const char *text = getenv("CAPC_CLOCK_OFFSET_S");
        seconds = text ? atol(text) : 0;
        read = 1;
    }
    return seconds;
}

int clock_gettime(clockid_t clock, struct timespec *now) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int status = real(clock, now);
    if (status == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) now->tv_sec += offset();
    return status;
}

int gettimeofday(struct timeval *restrict now, void *restrict zone) {
    static int (*real)(struct timeval *restrict, void *restrict) = 0;
    if (!real) real = (int (*)(struct timeval *restrict, void *restrict))dlsym(RTLD_NEXT, "gettimeofday");
    int status = real(now, zone);
    if (status == 0 && now) now->tv_sec += offset();
    return status;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}
