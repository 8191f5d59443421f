/*
 * The plain-C reference for hostpool's prefault engine: split a range into
 * page-aligned contiguous slices, one pthread per slice, and make one call per
 * slice. hostpool_raw_populate is the kernel's own path (the engine must reach
 * 0.9 of it); hostpool_raw_memset writes every byte (the memory-bandwidth
 * limit). Both return 0 or the first errno (EINVAL for a null or unaligned
 * address or threads < 1; more than 1024 threads are clamped to 1024).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

enum op { OP_POPULATE, OP_MEMSET };

struct slice {
    char *addr;
    size_t len;
    enum op op;
    int err;
};

static void *run_slice(void *arg)
{
    struct slice *s = arg;
    if (s->len == 0)
        return NULL;
    if (s->op == OP_MEMSET) {
        memset(s->addr, 1, s->len);
    } else {
        while (madvise(s->addr, s->len, MADV_POPULATE_WRITE) != 0) {
            if (errno != EINTR) {
                s->err = errno;
                break;
            }
        }
    }
    return NULL;
}

static int run(void *addr, size_t len, int threads, enum op op)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (addr == NULL || threads < 1 || (uintptr_t)addr % page != 0)
        return EINVAL;
    if (threads > 1024)
        threads = 1024;
    size_t n = (size_t)threads;
    size_t pages = len / page, base = pages / n, extra = pages % n;
    struct slice slices[1024];
    pthread_t tids[1024];
    char *p = addr;
    for (size_t i = 0; i < n; i++) {
        size_t bytes = (base + (i < extra ? 1 : 0)) * page;
        if (i == n - 1)
            bytes = (size_t)((char *)addr + len - p); /* a partial last page */
        slices[i] = (struct slice){ .addr = p, .len = bytes, .op = op, .err = 0 };
        p += bytes;
    }
    size_t started = 0;
    int err = 0;
    for (; started < n; started++) {
        int rc = pthread_create(&tids[started], NULL, run_slice, &slices[started]);
        if (rc != 0) {
            err = rc;
            break;
        }
    }
    for (size_t i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    for (size_t i = 0; i < n && err == 0; i++)
        err = slices[i].err;
    return err;
}

int hostpool_raw_populate(void *addr, size_t len, int threads)
{
    return run(addr, len, threads, OP_POPULATE);
}

int hostpool_raw_memset(void *addr, size_t len, int threads)
{
    return run(addr, len, threads, OP_MEMSET);
}
