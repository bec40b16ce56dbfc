#include "evict/controller.h"
#include "common/log.h"
#include "common/util.h"
#include "policy/policy.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

struct kvt_evictor {
    struct kvt_l1 *l1;
    kvt_l2 *l2;
    int tfd, kfd;
    _Atomic bool stop;
    pthread_t thr;
};

static void l2_cycle(kvt_l2 *l2)
{
    kvt_l2_reap(l2); /* objects that failed verification, once unpinned */
    /* a shared budget: renew this server's entry and read the tier's total,
     * which the usage fraction below compares with the watermark */
    kvt_l2_budget_refresh(l2);
    double watermark, ratio;
    if (!kvt_l2_evict_params(l2, &watermark, &ratio))
        return;
    if (kvt_l2_has_quotas(l2)) /* namespaces over their quota first: they may free enough */
        kvt_l2_evict_quotas(l2, 256);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    if (u.cap_bytes == 0 || u.fraction < watermark)
        return;
    uint64_t target = (uint64_t)((double)u.used_bytes * (1.0 - ratio));
    uint64_t freed = kvt_l2_evict_to(l2, target, 256);
    kvt_debug("%s: evicted %llu bytes (usage %.3f >= %.3f)", kvt_l2_name(l2),
              (unsigned long long)freed, u.fraction, watermark);
}

static void *ev_main(void *arg)
{
    struct kvt_evictor *ev = arg;
    pthread_setname_np(pthread_self(), ev->l1 ? "evict-l1" : "evict-l2");
    struct pollfd p[2] = {{.fd = ev->tfd, .events = POLLIN}, {.fd = ev->kfd, .events = POLLIN}};
    while (!atomic_load(&ev->stop)) {
        int n = poll(p, 2, -1);
        if (n < 0 && errno != EINTR)
            break;
        uint64_t v;
        for (int i = 0; i < 2; i++)
            if (p[i].revents & POLLIN) {
                ssize_t r = read(p[i].fd, &v, sizeof(v));
                (void)r;
            }
        if (atomic_load(&ev->stop))
            break;
        if (ev->l1) {
            kvt_l1_expire(ev->l1);
            kvt_l1_evict_cycle(ev->l1);
        } else {
            l2_cycle(ev->l2);
        }
    }
    return NULL;
}

/* Start an evictor thread; on failure everything made so far is closed
 * and the error returned (-errno, or pthread_create's own return: it does
 * not set errno). */
static int start(struct kvt_evictor **out, struct kvt_l1 *l1, kvt_l2 *l2, int interval_ms)
{
    struct kvt_evictor *ev = kvt_xcalloc(1, sizeof(*ev));
    int e = 0;
    ev->l1 = l1;
    ev->l2 = l2;
    ev->kfd = -1;
    ev->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (ev->tfd < 0) {
        e = -errno;
        goto fail;
    }
    ev->kfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ev->kfd < 0) {
        e = -errno;
        goto fail;
    }
    if (interval_ms <= 0)
        interval_ms = 1000;
    struct itimerspec its = {
        .it_interval = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000},
        .it_value = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000},
    };
    if (timerfd_settime(ev->tfd, 0, &its, NULL) < 0) {
        e = -errno;
        goto fail;
    }
    e = -pthread_create(&ev->thr, NULL, ev_main, ev);
    if (e)
        goto fail;
    *out = ev;
    return 0;
fail:
    if (ev->tfd >= 0)
        close(ev->tfd);
    if (ev->kfd >= 0)
        close(ev->kfd);
    free(ev);
    return e ? e : -EIO;
}

int kvt_evictor_start_l1(struct kvt_evictor **out, struct kvt_l1 *l1, int interval_ms)
{
    return start(out, l1, NULL, interval_ms);
}

/* One per adapter, with or without an eviction policy: it also removes
 * objects that failed verification (kvt_l2_reap). */
int kvt_evictor_start_l2(struct kvt_evictor **out, kvt_l2 *l2, int interval_ms)
{
    return start(out, NULL, l2, interval_ms);
}

void kvt_evictor_kick(struct kvt_evictor *ev)
{
    if (!ev)
        return;
    uint64_t one = 1;
    ssize_t w = write(ev->kfd, &one, sizeof(one));
    (void)w;
}

void kvt_evictor_stop(struct kvt_evictor *ev)
{
    if (!ev)
        return;
    atomic_store(&ev->stop, true);
    kvt_evictor_kick(ev);
    pthread_join(ev->thr, NULL);
    close(ev->tfd);
    close(ev->kfd);
    free(ev);
}
