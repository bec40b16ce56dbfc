/*
 * Description: the raw_block adapter through the kvt_l2 contract on a
 * pre-sized file: round trips with both engines and O_DIRECT on and off
 * (unaligned lengths and buffers bounce), delete and slot usage, restart
 * from the final checkpoint, a process that dies right after its stores
 * were acknowledged (journal replay), a damaged slot read as a miss, a
 * checkpoint that does not fit (an error in status, journal-full stores
 * fail, cleared after deletes), refusals to reinterpret a device, a slot
 * that holds slot_bytes of payload besides its header (a larger store is
 * counted as too big and named in the health line), and a device laid out
 * with the header inside slot_bytes opened as it was written.
 */
#include "l2/raw_block/raw_block.h"
#include "persist_harness.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

static char dev[256];

static bool healthy(kvt_l2 *l2);

static void make_dev(uint64_t size)
{
    unlink(dev);
    int fd = open(dev, O_RDWR | O_CREAT | O_TRUNC, 0644);
    TEST_ASSERT(fd >= 0);
    TEST_ASSERT(posix_fallocate(fd, 0, (off_t)size) == 0);
    close(fd);
}

static kvt_l2 *open_rb(const char *extra)
{
    char js[1024];
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 262144, "
             "\"meta_total_bytes\": 1048576%s}",
             dev, extra);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2 != NULL);
    h_wait_recovered(l2);
    return l2;
}

static void round_trip(const char *extra)
{
    fprintf(stderr, "   config:%s\n", extra);
    make_dev(16 << 20);
    kvt_l2 *l2 = open_rb(extra);
    /* 100000 bytes: not a block multiple, so the tail goes through a bounce */
    TEST_ASSERT(h_store(l2, "rb/model", 0, 20, 100000) == 20);
    TEST_ASSERT(h_check(l2, "rb/model", 0, 20, 100000) == 20);
    TEST_ASSERT(h_store(l2, "rb/model", 0, 20, 100000) == 20); /* already there: skipped */
    TEST_ASSERT(h_delete(l2, "rb/model", 0, 5) == 5);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 15 && u.used_bytes == 15 * (262144ull + 4096));
    TEST_ASSERT(h_check(l2, "rb/model", 0, 5, 100000) == 0);
    h_close(l2);
    l2 = open_rb(extra); /* the final checkpoint at close */
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 15 && u.used_bytes == 15 * (262144ull + 4096));
    TEST_ASSERT(h_check(l2, "rb/model", 5, 15, 100000) == 15);
    TEST_ASSERT(h_check(l2, "rb/model", 0, 5, 100000) == 0);
    TEST_ASSERT(h_status_int(l2, "meta", "records_since_checkpoint") == 0);
    h_close(l2);
}

static void test_round_trips(void)
{
    round_trip("");
    round_trip(", \"io_engine\": \"io_uring\", \"iouring_queue_depth\": 8");
    round_trip(", \"use_odirect\": false");
    round_trip(", \"enable_zero_copy\": false, \"max_data_transfer_size\": 65536");
}

/* A misaligned caller buffer under O_DIRECT is bounced, not an EINVAL. */
static void test_misaligned_buffer(void)
{
    make_dev(16 << 20);
    kvt_l2 *l2 = open_rb("");
    kvt_l2_task *t = kvt_l2_task_new(KVT_L2_STORE, 1);
    h_key(&t->keys[0], "rb/mis", 1);
    uint8_t *raw = h_payload(65536 + 64, 9);
    t->bufs[0].ptr = raw + 1;
    t->bufs[0].len = 65536;
    h_run(l2, t);
    TEST_ASSERT(kvt_bm_test(t->ok, 0));
    kvt_l2_task *ld = kvt_l2_task_new(KVT_L2_LOAD, 1);
    ld->keys[0] = t->keys[0];
    uint8_t *out = h_payload(65536 + 64, 0);
    ld->bufs[0].ptr = out + 3;
    ld->bufs[0].len = 65536;
    h_run(l2, ld);
    TEST_ASSERT(kvt_bm_test(ld->ok, 0) && memcmp(out + 3, raw + 1, 65536) == 0);
    TEST_ASSERT(h_status_int(l2, "bounced_transfers", NULL) >= 2);
    free(raw);
    free(out);
    kvt_l2_task_free(t);
    kvt_l2_task_free(ld);
    h_close(l2);
}

/* Fork a child that dies without closing its adapter and reports through a
 * pipe (its exit status belongs to the sanitizers: a thread leak report at
 * _exit is expected). Returns 0 in the child, *fd the write end; the pid in
 * the parent, *fd the read end. */
static pid_t fork_reporting(int *fd)
{
    int pfd[2];
    TEST_ASSERT(pipe(pfd) == 0);
    pid_t pid = fork();
    TEST_ASSERT(pid >= 0);
    close(pfd[pid == 0 ? 0 : 1]);
    *fd = pfd[pid == 0 ? 1 : 0];
    return pid;
}

/* In the child: send the report and die. */
static void report_and_die(int fd, const void *r, size_t len)
{
    _exit(write(fd, r, len) == (ssize_t)len ? 0 : 4);
}

/* In the parent: the child's report, once it is gone. */
static void collect_report(pid_t pid, int fd, void *r, size_t len)
{
    TEST_ASSERT(read(fd, r, len) == (ssize_t)len);
    close(fd);
    waitpid(pid, NULL, 0);
}

/* Stores acknowledged by a process that then dies without closing. */
static void test_acknowledged_survives_death(void)
{
    make_dev(32 << 20);
    int fd;
    pid_t pid = fork_reporting(&fd);
    if (pid == 0) {
        kvt_l2 *l2 = open_rb(", \"meta_enable_periodic\": false");
        uint32_t ok = h_store(l2, "rb/crash", 0, 40, 50000);
        uint32_t del = h_delete(l2, "rb/crash", 0, 4);
        char r = ok == 40 && del == 4 ? 'y' : 'n';
        report_and_die(fd, &r, 1); /* no close: no final checkpoint */
    }
    char r = 0;
    collect_report(pid, fd, &r, 1);
    TEST_ASSERT(r == 'y');
    kvt_l2 *l2 = open_rb("");
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 36);
    TEST_ASSERT(h_check(l2, "rb/crash", 4, 36, 50000) == 36);
    TEST_ASSERT(h_check(l2, "rb/crash", 0, 4, 50000) == 0);
    json_t *s = kvt_l2_status(l2);
    const char *from =
        json_string_value(json_object_get(json_object_get(s, "meta"), "recovered_from"));
    TEST_ASSERT(from && strstr(from, "journal records")); /* 44 since the last checkpoint */
    json_decref(s);
    h_close(l2);
}

/* What a jfault_child did, reported through a pipe: counts, and which keys
 * (bit i: key base + i) the adapter acknowledged as stored and as deleted. */
struct jf_report {
    int64_t faults, recovered, stored_after, objects, leaked;
    uint64_t acked_stores, acked_deletes;
};

/* In a child process with one EIO injected into the journal block at ring
 * position pos: store keys [first, first + nstore) (none if nstore is 0),
 * delete [del, del + 4), wait for health, store [20 + first, 30 + first).
 * Keys are reported relative to first. Dies without closing. */
static void jfault_child(uint32_t pos, uint32_t first, uint32_t nstore, uint32_t del,
                         struct jf_report *r)
{
    int fd;
    memset(r, 0, sizeof(*r));
    pid_t pid = fork_reporting(&fd);
    if (pid == 0) {
        /* meta_total_bytes 1 MiB: two 384 KiB checkpoint copies, then the
         * journal at 786432, 64 blocks of 4096 */
        char f[160];
        uint64_t off = 786432 + (uint64_t)(pos % 64) * 4096;
        snprintf(f, sizeof(f), "rate=1,lost,min_off=%llu,max_off=%llu,max=1",
                 (unsigned long long)off, (unsigned long long)off + 4096);
        setenv("KVT_IO_FAULT", f, 1);
        kvt_l2 *l2 = open_rb(", \"meta_enable_periodic\": false, \"use_odirect\": false");
        uint64_t bits = 0;
        if (nstore)
            h_store_bits(l2, "rb/jf", first, nstore, 50000, &bits);
        r->acked_stores = bits;
        bits = 0;
        /* waits for its DEL records, or their failure */
        h_delete_bits(l2, "rb/jf", del, 4, &bits);
        r->acked_deletes = bits << (del - first);
        r->faults = h_status_int(l2, "io", "injected_faults");
        for (int w = 0; w < 3000 && !healthy(l2); w++) /* 30 s: sanitizer builds */
            usleep(10000);
        r->recovered = healthy(l2) && h_status_int(l2, "meta", "journal_recoveries") == 1;
        bits = 0;
        r->stored_after = h_store_bits(l2, "rb/jf", 20 + first, 10, 50000, &bits);
        r->acked_stores |= bits << 20;
        struct kvt_l2_usage u;
        kvt_l2_usage(l2, &u);
        r->objects = (int64_t)u.objects;
        r->leaked = h_status_int(l2, "slots", NULL) - h_status_int(l2, "free_slots", NULL) -
                    (int64_t)u.objects;
        /* no close: the journal after the recovery checkpoint must replay */
        report_and_die(fd, r, sizeof(*r));
    }
    collect_report(pid, fd, r, sizeof(*r));
    fprintf(stderr,
            "   faults %lld, recovered %lld, stored after %lld, objects %lld, leaked "
            "slots %lld, acked stores %#llx, acked deletes %#llx\n",
            (long long)r->faults, (long long)r->recovered, (long long)r->stored_after,
            (long long)r->objects, (long long)r->leaked, (unsigned long long)r->acked_stores,
            (unsigned long long)r->acked_deletes);
    TEST_ASSERT(r->faults == 1);        /* the fault really happened */
    TEST_ASSERT(r->recovered == 1);     /* healthy again, by one recovery checkpoint */
    TEST_ASSERT(r->stored_after == 10); /* and it stores again */
    TEST_ASSERT(r->leaked == 0);        /* no slot lost with the records */
}

/* After the child died: every store it was told succeeded and did not
 * delete is there with its bytes, every delete it was told succeeded is
 * gone; held (bit i: key base + i) were there before the child. Returns
 * the keys present. */
static uint64_t jf_verify(kvt_l2 *l2, uint32_t base, uint64_t held, const struct jf_report *r)
{
    uint64_t present = 0;
    for (uint32_t i = 0; i < 64; i++)
        present |= (uint64_t)(h_check(l2, "rb/jf", base + i, 1, 50000) == 1) << i;
    uint64_t must = (held | r->acked_stores) & ~r->acked_deletes;
    if ((present & must) != must || (present & r->acked_deletes))
        fprintf(stderr, "   present %#llx, must be %#llx, deleted %#llx\n",
                (unsigned long long)present, (unsigned long long)must,
                (unsigned long long)r->acked_deletes);
    TEST_ASSERT((present & must) == must);          /* nothing acknowledged was lost */
    TEST_ASSERT((present & r->acked_deletes) == 0); /* nothing deleted came back */
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == (uint64_t)__builtin_popcountll(present));
    return present;
}

/* A journal write fails: its records are lost, the adapter refuses stores
 * until a checkpoint replaces them, then stores again; a process death
 * after that loses nothing acknowledged. First a block of PUTs fails (the
 * second journal block), then, on a device holding objects, a block of
 * DELs (their slots come back). */
static void test_journal_write_error_recovers(void)
{
    make_dev(32 << 20);
    struct jf_report r;
    jfault_child(1, 0, 10, 0, &r);
    kvt_l2 *l2 = open_rb("");
    TEST_ASSERT(h_status_int(l2, "meta", "journal_offset") == 786432);
    uint64_t present = jf_verify(l2, 0, 0, &r);
    TEST_ASSERT((present >> 20) == 0x3ff); /* 20..29, stored after the recovery */
    /* deletes are refused while the journal is down: some of 0..3 survive */
    TEST_ASSERT(r.acked_deletes != 0xf);
    /* 10 known objects, and where the next journal block goes */
    h_delete(l2, "rb/jf", 0, 30);
    TEST_ASSERT(h_store(l2, "rb/jf", 100, 10, 50000) == 10);
    h_close(l2);
    l2 = open_rb("");
    uint32_t pos = (uint32_t)h_status_int(l2, "meta", "journal_next_block");
    h_close(l2); /* nothing since the final checkpoint: no write */
    /* deletes go one by one, each waiting for its DEL record: the DEL of
     * 100 is the block that fails, 101..103 are refused while it is down */
    jfault_child(pos, 100, 0, 100, &r);
    /* the DEL of 100 is reported done (the recovery checkpoint carries it);
     * 101..103 are refused while the journal is down, but the recovery
     * checkpoint is tried at once, so on a loaded machine it can be back
     * before the next delete arrives: those are then done too. Either
     * way every acknowledged delete is gone and every other object stays. */
    TEST_ASSERT(r.acked_deletes & 0x1);
    TEST_ASSERT(!(r.acked_deletes & ~0xfull));
    int gone = __builtin_popcountll(r.acked_deletes);
    TEST_ASSERT(r.objects == 9 + 10 + 1 - gone);
    l2 = open_rb("");
    present = jf_verify(l2, 100, 0x3ff, &r);
    TEST_ASSERT(!(present & 1)); /* the recovery checkpoint has the DEL of 100 */
    TEST_ASSERT(present == ((0x3ffull << 20) | (0x3ffull & ~r.acked_deletes)));
    TEST_ASSERT(h_status_int(l2, "slots", NULL) - h_status_int(l2, "free_slots", NULL) ==
                9 + 10 + 1 - gone);
    h_close(l2);
}

/* docs/persistent-adapters.md: a delete whose record was not yet written
 * when the process died leaves the object, intact, after restart. The DEL
 * record's journal block never reaches the device (KVT_IO_FAULT lost) and
 * the process dies as soon as the delete returned. Were a recovery
 * checkpoint (which would carry the DEL) written before the death, the
 * checkpoint sequence after the restart says so, and the object is gone. */
static void test_unwritten_del_leaves_the_object_intact(void)
{
    make_dev(32 << 20);
    kvt_l2 *l2 = open_rb("");
    TEST_ASSERT(h_store(l2, "rb/ud", 0, 10, 50000) == 10);
    h_close(l2);
    l2 = open_rb("");
    uint32_t pos = (uint32_t)h_status_int(l2, "meta", "journal_next_block");
    long long seq = h_status_int(l2, "meta", "checkpoint_seq");
    h_close(l2);
    int fd;
    pid_t pid = fork_reporting(&fd);
    if (pid == 0) {
        char f[160];
        uint64_t off = 786432 + (uint64_t)(pos % 64) * 4096;
        snprintf(f, sizeof(f), "rate=1,lost,min_off=%llu,max_off=%llu,max=1",
                 (unsigned long long)off, (unsigned long long)off + 4096);
        setenv("KVT_IO_FAULT", f, 1);
        kvt_l2 *c = open_rb(", \"meta_enable_periodic\": false, \"use_odirect\": false");
        uint64_t removed = 0;
        h_delete_bits(c, "rb/ud", 3, 1, &removed);
        report_and_die(fd, &removed, sizeof(removed)); /* no close, no checkpoint */
    }
    uint64_t removed = 0;
    collect_report(pid, fd, &removed, sizeof(removed));
    l2 = open_rb("");
    uint32_t ok3 = h_check(l2, "rb/ud", 3, 1, 50000);
    long long seq2 = h_status_int(l2, "meta", "checkpoint_seq");
    fprintf(stderr, "   delete reported %llu, checkpoint %lld -> %lld, key 3 after restart %u\n",
            (unsigned long long)removed, seq, seq2, ok3);
    TEST_ASSERT(h_check(l2, "rb/ud", 0, 3, 50000) == 3);
    TEST_ASSERT(h_check(l2, "rb/ud", 4, 6, 50000) == 6);
    if (seq2 == seq) /* the DEL is nowhere on the device: the object is intact */
        TEST_ASSERT(ok3 == 1);
    else
        TEST_ASSERT(ok3 == 0);
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 9 + ok3);
    TEST_ASSERT(h_status_int(l2, "verify_failed", NULL) == 0);
    h_close(l2);
}

static void test_damaged_slot_is_a_miss(void)
{
    make_dev(16 << 20);
    kvt_l2 *l2 = open_rb(", \"use_odirect\": false");
    TEST_ASSERT(h_store(l2, "rb/dmg", 0, 3, 30000) == 3);
    /* slot 0 holds the first store: flip one payload byte on the device */
    int fd = open(dev, O_RDWR);
    uint8_t b;
    uint64_t off = (1 << 20) + 4096 + 777;
    TEST_ASSERT(pread(fd, &b, 1, (off_t)off) == 1);
    b ^= 0x40;
    TEST_ASSERT(pwrite(fd, &b, 1, (off_t)off) == 1);
    close(fd);
    TEST_ASSERT(h_check(l2, "rb/dmg", 0, 3, 30000) == 2);
    TEST_ASSERT(h_status_int(l2, "verify_failed", NULL) == 1);
    h_close(l2);
}

static bool healthy(kvt_l2 *l2)
{
    char msg[256];
    return kvt_l2_healthy(l2, msg, sizeof(msg));
}

/* A meta area of 16 blocks: 4 journal blocks, checkpoint copies of 6
 * blocks (about 250 records). 400 objects cannot be checkpointed. */
static void test_checkpoint_too_big(void)
{
    make_dev(5 << 20);
    char js[512];
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 4096, "
             "\"meta_total_bytes\": 65536, \"use_odirect\": false}",
             dev);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    uint32_t stored = 0, failed_batches = 0;
    for (uint32_t i = 0; i < 600 && failed_batches < 3; i += 10) {
        uint32_t ok = h_store(l2, "rb/ck", i, 10, 1000);
        stored += ok;
        if (ok < 10)
            failed_batches++;
    }
    json_t *s = kvt_l2_status(l2);
    const char *ce =
        json_string_value(json_object_get(json_object_get(s, "meta"), "checkpoint_error"));
    TEST_ASSERT(ce && strstr(ce, "raise meta_total_bytes"));
    json_decref(s);
    TEST_ASSERT(!healthy(l2));
    TEST_ASSERT(failed_batches > 0); /* the journal filled: stores refused */
    fprintf(stderr, "   stored %u before the journal filled\n", stored);
    TEST_ASSERT(stored > 250 && stored < 600);
    TEST_ASSERT(h_status_int(l2, "counters", "rejected_writes") > 0);
    /* what was acknowledged is still there */
    TEST_ASSERT(h_check(l2, "rb/ck", 0, 100, 1000) == 100);
    /* make room: the next checkpoint fits and the error clears */
    kvt_key *k = calloc(600, sizeof(*k));
    for (uint32_t i = 0; i < 600; i++)
        h_key(&k[i], "rb/ck", i);
    uint32_t removed = kvt_l2_delete(l2, k, 600, NULL);
    free(k);
    TEST_ASSERT(removed > 0);
    for (int w = 0; w < 500 && !healthy(l2); w++) {
        h_store(l2, "rb/ck2", (uint32_t)w * 3, 3, 1000); /* activity triggers checkpoints */
        usleep(10000);
    }
    TEST_ASSERT(healthy(l2));
    h_close(l2);
}

static void test_refusals(void)
{
    char err[1024], js[512];
    make_dev(16 << 20);
    kvt_l2 *l2 = open_rb("");
    TEST_ASSERT(h_store(l2, "rb/ref", 0, 2, 1000) == 2);
    h_close(l2);
    /* another slot size on the same device */
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 524288, "
             "\"meta_total_bytes\": 1048576}",
             dev);
    TEST_ASSERT(h_open_err(js, err, sizeof(err)) == KVT_E_CONFIG);
    TEST_ASSERT(strstr(err, "another layout") && strstr(err, "load_checkpoint_on_init"));
    /* another meta_version */
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 262144, "
             "\"meta_total_bytes\": 1048576, \"meta_version\": 2}",
             dev);
    TEST_ASSERT(h_open_err(js, err, sizeof(err)) == KVT_E_CONFIG);
    TEST_ASSERT(strstr(err, "another format or meta_version"));
    /* starting empty on purpose */
    l2 = open_rb(", \"load_checkpoint_on_init\": false");
    struct kvt_l2_usage u;
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 0);
    h_close(l2);
    /* and the old index never comes back afterwards */
    l2 = open_rb("");
    kvt_l2_usage(l2, &u);
    TEST_ASSERT(u.objects == 0);
    TEST_ASSERT(h_check(l2, "rb/ref", 0, 2, 1000) == 0);
    h_close(l2);
    /* a missing device without capacity_bytes */
    unlink(dev);
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 262144}", dev);
    TEST_ASSERT(h_open_err(js, err, sizeof(err)) != 0 && strstr(err, "fallocate"));
}

/* The seed's "slot_bytes": 1048576 holds objects of 1 MiB: a slot is
 * header_bytes + slot_bytes. One byte more is refused as too big, counted,
 * and the health line says so. */
static void test_slot_holds_slot_bytes(void)
{
    make_dev(24 << 20);
    char js[512];
    snprintf(js, sizeof(js),
             "{\"type\": \"raw_block\", \"device_path\": \"%s\", \"slot_bytes\": 1048576, "
             "\"meta_total_bytes\": 1048576}",
             dev);
    kvt_l2 *l2 = h_open(js);
    TEST_ASSERT(l2);
    h_wait_recovered(l2);
    TEST_ASSERT(h_status_int(l2, "slot_bytes", NULL) == 1048576);
    TEST_ASSERT(h_status_int(l2, "slot_stride_bytes", NULL) == 1048576 + 4096);
    TEST_ASSERT(h_status_int(l2, "slots", NULL) == (23 << 20) / (1048576 + 4096));
    TEST_ASSERT(h_store(l2, "rb/mib", 0, 4, 1048576) == 4);
    TEST_ASSERT(h_check(l2, "rb/mib", 0, 4, 1048576) == 4);
    TEST_ASSERT(h_status_int(l2, "counters", "too_big") == 0);
    TEST_ASSERT(h_store(l2, "rb/mib", 10, 2, 1048576 + 1) == 0);
    TEST_ASSERT(h_status_int(l2, "counters", "too_big") == 2);
    json_t *st = kvt_l2_status(l2);
    const char *health = json_string_value(json_object_get(st, "health"));
    fprintf(stderr, "   health: %s\n", health);
    TEST_ASSERT(json_is_true(json_object_get(st, "is_healthy")));
    TEST_ASSERT(strstr(health, "2 stores refused as too big (objects up to 1048576 bytes)"));
    json_decref(st);
    h_close(l2);
}

/* A device whose index was written with slots of slot_bytes, header
 * included (the same on-device format, a smaller stride), opens with that
 * layout: its objects stay readable and the largest object is
 * slot_bytes - header_bytes. */
static void test_earlier_layout_kept(void)
{
    make_dev(16 << 20);
    int fd = open(dev, O_RDWR);
    TEST_ASSERT(fd >= 0);
    struct rb_geom g;
    char err[256];
    TEST_ASSERT(rb_geom_init(&g, 16 << 20, 4096, 4096, 262144, 1 << 20, err, sizeof(err)) == 0);
    struct rb_ckpt_hdr h = {.version = 1,
                            .instance = 42,
                            .next_gen = 1,
                            .block = 4096,
                            .header_bytes = 4096,
                            .slot_bytes = 262144,
                            .meta_total = 1 << 20,
                            .data_off = g.data_off,
                            .nslots = g.nslots};
    memcpy(h.magic, "LMCIDX01", 8);
    for (uint64_t seq = 1; seq <= 2; seq++) {
        h.seq = seq;
        TEST_ASSERT(rb_write_checkpoint(fd, &g, &h, NULL, 0, (int)(seq % 2)) == 0);
    }
    close(fd);
    kvt_l2 *l2 = open_rb("");
    TEST_ASSERT(h_status_int(l2, "slot_stride_bytes", NULL) == 262144);
    TEST_ASSERT(h_status_int(l2, "slots", NULL) == g.nslots);
    TEST_ASSERT(h_store(l2, "rb/old", 0, 3, 262144 - 4096) == 3);
    TEST_ASSERT(h_store(l2, "rb/old", 5, 1, 262144) == 0); /* too big for this layout */
    h_close(l2);
    l2 = open_rb("");
    TEST_ASSERT(h_check(l2, "rb/old", 0, 3, 262144 - 4096) == 3);
    h_close(l2);
    /* starting empty on purpose takes the configured layout */
    l2 = open_rb(", \"load_checkpoint_on_init\": false");
    TEST_ASSERT(h_status_int(l2, "slot_stride_bytes", NULL) == 262144 + 4096);
    h_close(l2);
}

int main(void)
{
    snprintf(dev, sizeof(dev), "/tmp/kvt-test-rb-%d.img", (int)getpid());
    RUN(test_round_trips);
    RUN(test_misaligned_buffer);
    RUN(test_acknowledged_survives_death);
    RUN(test_journal_write_error_recovers);
    RUN(test_unwritten_del_leaves_the_object_intact);
    RUN(test_damaged_slot_is_a_miss);
    RUN(test_checkpoint_too_big);
    RUN(test_refusals);
    RUN(test_slot_holds_slot_bytes);
    RUN(test_earlier_layout_kept);
    unlink(dev);
    return TEST_RESULT();
}
