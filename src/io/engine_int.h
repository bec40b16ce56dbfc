/* Private to the I/O engines (engine.c, engine_uring.c). */
#ifndef KVT_IO_ENGINE_INT_H
#define KVT_IO_ENGINE_INT_H

#include "io/engine.h"

#include <stdatomic.h>

struct kvt_ioeng_ops {
    void (*submitv)(struct kvt_ioeng *e, struct kvt_io **ios, size_t n);
    void (*destroy)(struct kvt_ioeng *e);
};

struct kvt_ioeng {
    const struct kvt_ioeng_ops *ops;
    enum kvt_ioeng_kind kind;
    int depth;
    char name[16];
    /* counters: relaxed atomics, read for status only */
    _Atomic uint64_t submitted, completed, errors, retries, bytes_read, bytes_written;
    _Atomic uint32_t inflight, inflight_max;
    /* fault injection for tests (KVT_IO_FAULT, read at creation) */
    double fault_rate;
    uint64_t fault_seed;
    bool f_eio, f_enospc, f_short, f_torn, f_lost;
    uint64_t fault_min_off, fault_max_off; /* only requests starting in [min, max); max 0: any */
    uint64_t fault_max;                    /* at most this many faults; 0: no limit */
    _Atomic uint64_t fault_counter, faults;
};

/* Test hook: a short transfer replaces r bytes by fewer (the request is then
 * retried for the rest, as after a real short transfer). */
uint64_t kvt_ioeng_fault_short(struct kvt_ioeng *e, struct kvt_io *io, uint64_t r);

void kvt_ioeng_base_init(struct kvt_ioeng *e, const struct kvt_ioeng_ops *ops,
                         enum kvt_ioeng_kind kind, const char *name, int depth);
/* Account a finished request and run its callback. */
void kvt_ioeng_complete(struct kvt_ioeng *e, struct kvt_io *io, int res);
/* Advance io's iovecs past n transferred bytes (short transfer). */
void kvt_io_advance(struct kvt_io *io, uint64_t n);

int kvt_ioeng_uring_create(struct kvt_ioeng **out, const char *name, int depth, char *err,
                           size_t errcap);

#endif
