/*
 * Description: both I/O engines (posix threads, io_uring) move every byte of
 * multi-iovec reads and writes, report a short read at EOF, report errors as
 * -errno, run many concurrent requests with a bounded depth, and accept
 * resubmission from a callback.
 */
#include "io/engine.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char dir[256];

#define RUN_ARG(fn, arg)                                                                           \
    do {                                                                                           \
        fprintf(stderr, "-- %s(%s)\n", #fn, #arg);                                                 \
        fn(arg);                                                                                   \
    } while (0)

struct ctr {
    _Atomic int done;
    _Atomic int bad;
    pthread_mutex_t m;
    pthread_cond_t c;
};

static void count_cb(struct kvt_io *io)
{
    struct ctr *c = io->udata;
    if (io->res != (int)io->len)
        atomic_fetch_add(&c->bad, 1);
    pthread_mutex_lock(&c->m);
    atomic_fetch_add(&c->done, 1);
    pthread_cond_signal(&c->c);
    pthread_mutex_unlock(&c->m);
}

static void wait_for(struct ctr *c, int n)
{
    pthread_mutex_lock(&c->m);
    while (atomic_load(&c->done) < n)
        pthread_cond_wait(&c->c, &c->m);
    pthread_mutex_unlock(&c->m);
}

static void test_engine(enum kvt_ioeng_kind kind)
{
    char err[256];
    struct kvt_ioeng *e = NULL;
    int rc = kvt_ioeng_create(&e, kind, "t", 8, err, sizeof(err));
    if (rc && kind == KVT_IOENG_URING) {
        fprintf(stderr, "io_uring unavailable (%s): skipping that engine\n", err);
        return;
    }
    TEST_ASSERT(rc == 0);
    char path[300];
    snprintf(path, sizeof(path), "%s/f%d", dir, (int)kind);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    TEST_ASSERT(fd >= 0);

    /* three iovecs at an offset */
    char a[1000], b[5000], c[77];
    memset(a, 'a', sizeof(a));
    memset(b, 'b', sizeof(b));
    memset(c, 'c', sizeof(c));
    struct kvt_io io;
    kvt_io_prep(&io, KVT_IO_WRITE, fd, 100, NULL, NULL);
    kvt_io_add(&io, a, sizeof(a));
    kvt_io_add(&io, b, sizeof(b));
    kvt_io_add(&io, c, sizeof(c));
    TEST_ASSERT(kvt_ioeng_run(e, &io) == 6077);
    struct stat st;
    fstat(fd, &st);
    TEST_ASSERT(st.st_size == 6177);

    /* read back into two buffers; the second is larger than what is left */
    char r1[1100], r2[10000];
    kvt_io_prep(&io, KVT_IO_READ, fd, 0, NULL, NULL);
    kvt_io_add(&io, r1, sizeof(r1));
    kvt_io_add(&io, r2, sizeof(r2));
    TEST_ASSERT(kvt_ioeng_run(e, &io) == 6177); /* short at EOF */
    TEST_ASSERT(r1[100] == 'a' && r1[1099] == 'a' && r2[0] == 'b' && r2[6176 - 1100] == 'c');

    /* errors come back as -errno */
    kvt_io_prep(&io, KVT_IO_READ, 987654, 0, NULL, NULL);
    kvt_io_add(&io, r1, 10);
    TEST_ASSERT(kvt_ioeng_run(e, &io) == -EBADF);
    kvt_io_prep(&io, KVT_IO_FSYNC, fd, 0, NULL, NULL);
    TEST_ASSERT(kvt_ioeng_run(e, &io) == 0);

    /* 256 concurrent 64 KiB writes, then reads, depth 8 */
    enum { N = 256, SZ = 65536 };
    char *buf = malloc((size_t)N * SZ), *back = malloc((size_t)N * SZ);
    for (size_t i = 0; i < (size_t)N * SZ; i++)
        buf[i] = (char)(i * 7 + i / 65536);
    struct kvt_io *ios = calloc(N, sizeof(*ios));
    struct kvt_io **pp = calloc(N, sizeof(*pp));
    struct ctr ctr = {0};
    pthread_mutex_init(&ctr.m, NULL);
    pthread_cond_init(&ctr.c, NULL);
    for (int i = 0; i < N; i++) {
        kvt_io_prep(&ios[i], KVT_IO_WRITE, fd, (uint64_t)i * SZ, count_cb, &ctr);
        kvt_io_add(&ios[i], buf + (size_t)i * SZ, SZ);
        pp[i] = &ios[i];
    }
    kvt_ioeng_submitv(e, pp, N);
    wait_for(&ctr, N);
    TEST_ASSERT(atomic_load(&ctr.bad) == 0);
    atomic_store(&ctr.done, 0);
    for (int i = 0; i < N; i++) {
        kvt_io_prep(&ios[i], KVT_IO_READ, fd, (uint64_t)i * SZ, count_cb, &ctr);
        kvt_io_add(&ios[i], back + (size_t)i * SZ, SZ);
        kvt_ioeng_submit(e, &ios[i]);
    }
    wait_for(&ctr, N);
    TEST_ASSERT(atomic_load(&ctr.bad) == 0);
    TEST_ASSERT(memcmp(buf, back, (size_t)N * SZ) == 0);
    struct kvt_ioeng_stats s;
    kvt_ioeng_get_stats(e, &s);
    TEST_ASSERT(s.inflight == 0 && s.completed == s.submitted);
    TEST_ASSERT(s.inflight_max >= N); /* the N of one submitv were outstanding together */

    /* O_DIRECT with aligned buffers (skipped where the fs refuses it) */
    int dfd = open(path, O_RDWR | O_DIRECT);
    if (dfd >= 0) {
        void *al = NULL;
        TEST_ASSERT(posix_memalign(&al, 4096, 1 << 20) == 0);
        memset(al, 0x5a, 1 << 20);
        kvt_io_prep(&io, KVT_IO_WRITE, dfd, 1 << 20, NULL, NULL);
        kvt_io_add(&io, al, 1 << 20);
        TEST_ASSERT(kvt_ioeng_run(e, &io) == 1 << 20);
        memset(al, 0, 1 << 20);
        kvt_io_prep(&io, KVT_IO_READ, dfd, 1 << 20, NULL, NULL);
        kvt_io_add(&io, al, 1 << 20);
        TEST_ASSERT(kvt_ioeng_run(e, &io) == 1 << 20);
        TEST_ASSERT(((unsigned char *)al)[12345] == 0x5a);
        /* misaligned buffer under O_DIRECT: an error, not a crash */
        kvt_io_prep(&io, KVT_IO_READ, dfd, 0, NULL, NULL);
        kvt_io_add(&io, (char *)al + 1, 4096);
        TEST_ASSERT(kvt_ioeng_run(e, &io) == -EINVAL);
        free(al);
        close(dfd);
    }
    kvt_ioeng_destroy(e);
    close(fd);
    unlink(path);
    free(buf);
    free(back);
    free(ios);
    free(pp);
}

/* A callback that resubmits its own request until it ran 100 times. */
struct chain {
    struct kvt_ioeng *e;
    int left;
    struct ctr *c;
    uint64_t *word;
};

static void chain_cb(struct kvt_io *io)
{
    struct chain *ch = io->udata;
    if (--ch->left > 0) {
        /* the engine advanced off and the iovec: point them again */
        io->iov[0].iov_base = ch->word;
        io->iov[0].iov_len = 8;
        io->iovcnt = 1;
        io->len = 8;
        kvt_ioeng_submit(ch->e, io);
        return;
    }
    pthread_mutex_lock(&ch->c->m);
    atomic_fetch_add(&ch->c->done, 1);
    pthread_cond_signal(&ch->c->c);
    pthread_mutex_unlock(&ch->c->m);
}

static void test_resubmit_from_callback(enum kvt_ioeng_kind kind)
{
    char err[256];
    struct kvt_ioeng *e = NULL;
    if (kvt_ioeng_create(&e, kind, "t", 2, err, sizeof(err)))
        return;
    char path[300];
    snprintf(path, sizeof(path), "%s/chain%d", dir, (int)kind);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    TEST_ASSERT(fd >= 0);
    struct ctr ctr = {0};
    pthread_mutex_init(&ctr.m, NULL);
    pthread_cond_init(&ctr.c, NULL);
    uint64_t word = 0x1122334455667788ull;
    struct chain ch = {.e = e, .left = 100, .c = &ctr, .word = &word};
    struct kvt_io io;
    kvt_io_prep(&io, KVT_IO_WRITE, fd, 0, chain_cb, &ch);
    kvt_io_add(&io, &word, 8);
    kvt_ioeng_submit(e, &io);
    wait_for(&ctr, 1);
    struct stat st;
    fstat(fd, &st);
    TEST_ASSERT(st.st_size == 800);
    kvt_ioeng_destroy(e);
    close(fd);
    unlink(path);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvt-test-io-%d", (int)getpid());
    mkdir(dir, 0755);
    TEST_ASSERT(kvt_ioeng_kind_parse("posix") == KVT_IOENG_POSIX);
    TEST_ASSERT(kvt_ioeng_kind_parse("io_uring") == KVT_IOENG_URING);
    TEST_ASSERT(kvt_ioeng_kind_parse("aio") == -1);
    RUN_ARG(test_engine, KVT_IOENG_POSIX);
    RUN_ARG(test_engine, KVT_IOENG_URING);
    RUN_ARG(test_resubmit_from_callback, KVT_IOENG_POSIX);
    RUN_ARG(test_resubmit_from_callback, KVT_IOENG_URING);
    rmdir(dir);
    return TEST_RESULT();
}
