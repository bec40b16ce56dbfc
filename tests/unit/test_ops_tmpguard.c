/*
 * Description: the tmp guard's rules with real processes: a live writer's
 * tmp file is kept however old (named by pid + start time, by file lock, or
 * by a registry marker), a dead writer's is removable at once, a reused pid
 * does not count as the writer, unmarked tmp files wait 15 minutes, an
 * unreadable marker keeps the file, dead writers' markers go after an hour.
 */
#include "test.h"

#include "l2/kit/tmpguard.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[256];
static int dfd = -1;

static void touch(const char *name, time_t mtime)
{
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    TEST_ASSERT(fd >= 0);
    TEST_ASSERT(write(fd, "partial", 7) == 7);
    close(fd);
    struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
    TEST_ASSERT(utimensat(dfd, name, ts, 0) == 0);
}

static enum kvt_tmp_verdict verdict(struct kvt_tmpguard *g, const char *name)
{
    struct stat st;
    TEST_ASSERT(fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0);
    return kvt_tmpguard_classify(g, dfd, name, &st, NULL);
}

/* A child that sleeps until killed: a live writer. */
static pid_t sleeper(void)
{
    pid_t p = fork();
    TEST_ASSERT(p >= 0);
    if (p == 0) {
        for (;;)
            pause();
    }
    return p;
}

static uint64_t start_of(pid_t p)
{
    char st;
    uint64_t s = 0;
    for (int i = 0; i < 100 && kvt_proc_stat(p, &st, &s) != 0; i++)
        usleep(1000);
    return s;
}

static void reap(pid_t p)
{
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
}

static void test_names(void)
{
    char buf[300];
    TEST_ASSERT(kvt_tmpguard_name(buf, sizeof(buf), "m_00000000_0_ab.bin", 0x1234, 0xabcdef, 7) >
                0);
    TEST_ASSERT(strcmp(buf, "m_00000000_0_ab.bin.tmp.1234-abcdef-7") == 0);
    pid_t pid;
    uint64_t start;
    TEST_ASSERT(kvt_tmpguard_parse(buf, &pid, &start) && pid == 0x1234 && start == 0xabcdef);
    TEST_ASSERT(!kvt_tmpguard_parse("x.bin.tmp.0123456789abcdef0123456789abcdef", &pid, &start));
    TEST_ASSERT(!kvt_tmpguard_parse("x.bin.tmp.12-34", &pid, &start));
    TEST_ASSERT(!kvt_tmpguard_parse("x.bin.tmp.12-34-5-6", &pid, &start));
    TEST_ASSERT(!kvt_tmpguard_parse("x.bin.tmp.1g-34-5", &pid, &start));
    TEST_ASSERT(kvt_tmpguard_is_tmp("a.bin.tmp.x") && !kvt_tmpguard_is_tmp("a.bin") &&
                !kvt_tmpguard_is_tmp("a.bin.tmp."));
    TEST_ASSERT(kvt_tmpguard_name(buf, 20, "m_00000000_0_ab.bin", 1, 2, 3) == -ENAMETOOLONG);
}

static void test_liveness(void)
{
    pid_t p = sleeper();
    uint64_t s = start_of(p);
    TEST_ASSERT(s != 0);
    TEST_ASSERT(kvt_proc_alive(p, s) == 1);
    TEST_ASSERT(kvt_proc_alive(p, s + 1) == 0); /* same pid, another start: reused pid */
    reap(p);
    TEST_ASSERT(kvt_proc_alive(p, s) == 0);
    /* a zombie is not a writer */
    pid_t z = fork();
    if (z == 0)
        _exit(0);
    uint64_t zs = start_of(z);
    for (int i = 0; i < 200; i++) {
        char st = 0;
        uint64_t x;
        if (kvt_proc_stat(z, &st, &x) == 0 && st == 'Z')
            break;
        usleep(1000);
    }
    TEST_ASSERT(kvt_proc_alive(z, zs) == 0);
    waitpid(z, NULL, 0);
}

static void test_classify(void)
{
    time_t now = time(NULL);
    struct kvt_tmpguard g;
    TEST_ASSERT(kvt_tmpguard_init(&g, dfd) == 0 && g.proc_ok && g.regfd < 0);
    char name[300];

    /* ours */
    kvt_tmpguard_name(name, sizeof(name), "a_00000000_0_01.bin", getpid(), g.self_start, 1);
    touch(name, now - 100000);
    TEST_ASSERT(verdict(&g, name) == KVT_TMP_OURS);

    /* a live writer named in the file: kept even when days old */
    pid_t p = sleeper();
    uint64_t s = start_of(p);
    kvt_tmpguard_name(name, sizeof(name), "b_00000000_0_02.bin", p, s, 9);
    touch(name, now - 3 * 86400);
    TEST_ASSERT(verdict(&g, name) == KVT_TMP_LIVE);
    /* the same pid with another start time is not that writer */
    char reused[300];
    kvt_tmpguard_name(reused, sizeof(reused), "b_00000000_0_03.bin", p, s + 5, 9);
    touch(reused, now);
    TEST_ASSERT(verdict(&g, reused) == KVT_TMP_DEAD);
    reap(p);
    TEST_ASSERT(verdict(&g, name) == KVT_TMP_DEAD); /* removable once the process is gone */

    /* without a marker: 15 minutes by mtime, then stale */
    const char *uuid = "c_00000000_0_04.bin.tmp.0123456789abcdef0123456789abcdef";
    touch(uuid, now - 60);
    TEST_ASSERT(verdict(&g, uuid) == KVT_TMP_RECENT);
    touch(uuid, now - 16 * 60);
    TEST_ASSERT(verdict(&g, uuid) == KVT_TMP_STALE);
    touch(uuid, now + 3600); /* a clock ahead: recent, kept */
    TEST_ASSERT(verdict(&g, uuid) == KVT_TMP_RECENT);

    /* a writer holding the lock is live whatever the name says */
    const char *locked = "d_00000000_0_05.bin.tmp.feedfacefeedface";
    touch(locked, now - 86400);
    int sync[2];
    TEST_ASSERT(pipe(sync) == 0);
    pid_t lw = fork();
    if (lw == 0) {
        int fd = openat(dfd, locked, O_WRONLY);
        if (fd < 0 || kvt_tmpguard_hold(fd) != 0)
            _exit(1);
        char c = 1;
        if (write(sync[1], &c, 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c;
    TEST_ASSERT(read(sync[0], &c, 1) == 1);
    TEST_ASSERT(verdict(&g, locked) == KVT_TMP_LIVE);
    reap(lw);
    TEST_ASSERT(verdict(&g, locked) == KVT_TMP_STALE); /* lock gone with the process */
    close(sync[0]);
    close(sync[1]);

    /* undecidable: no /proc to ask */
    g.proc_ok = false;
    pid_t q = sleeper();
    kvt_tmpguard_name(name, sizeof(name), "e_00000000_0_06.bin", q, start_of(q), 1);
    touch(name, now - 86400);
    TEST_ASSERT(verdict(&g, name) == KVT_TMP_UNDECIDABLE);
    reap(q);
    TEST_ASSERT(verdict(&g, name) == KVT_TMP_UNDECIDABLE); /* still no way to know: keep */
    g.proc_ok = true;
    kvt_tmpguard_fini(&g);
}

static void write_marker(int regfd, const char *name, const char *content, time_t mtime)
{
    int fd = openat(regfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    TEST_ASSERT(fd >= 0);
    TEST_ASSERT(write(fd, content, strlen(content)) == (ssize_t)strlen(content));
    close(fd);
    struct timespec ts[2] = {{mtime, 0}, {mtime, 0}};
    TEST_ASSERT(utimensat(regfd, name, ts, 0) == 0);
}

static void test_registry(void)
{
    time_t now = time(NULL);
    TEST_ASSERT(mkdirat(dfd, KVT_TMPGUARD_DIR, 0755) == 0);
    struct kvt_tmpguard g;
    TEST_ASSERT(kvt_tmpguard_init(&g, dfd) == 0 && g.regfd >= 0);
    char content[128];
    pid_t p = sleeper();
    uint64_t s = start_of(p);

    /* an unmarked-looking (uuid) name, registered by a live writer: kept */
    const char *t1 = "f_00000000_0_07.bin.tmp.11112222333344445555666677778888";
    touch(t1, now - 86400);
    snprintf(content, sizeof(content), "pid=%d start=%llu\n", (int)p, (unsigned long long)s);
    write_marker(g.regfd, t1, content, now - 7200);
    TEST_ASSERT(verdict(&g, t1) == KVT_TMP_LIVE);

    /* an unreadable (garbled) marker keeps its file */
    const char *t2 = "g_00000000_0_08.bin.tmp.aaaabbbbccccddddeeeeffff00001111";
    touch(t2, now - 86400);
    write_marker(g.regfd, t2, "garbage", now);
    TEST_ASSERT(verdict(&g, t2) == KVT_TMP_UNDECIDABLE);

    /* the writer dies: its file is removable, its marker stays an hour */
    reap(p);
    TEST_ASSERT(verdict(&g, t1) == KVT_TMP_DEAD);
    const char *young = "h_00000000_0_09.bin.tmp.x";
    write_marker(g.regfd, young, content, now - 60); /* dead writer, marker 1 minute old */
    uint64_t swept = 0, kept = 0;
    TEST_ASSERT(kvt_tmpguard_sweep_markers(&g, &swept, &kept) == 0);
    /* t1's marker is 2 h old and dead: swept; garbled and young ones stay */
    TEST_ASSERT(swept == 1 && kept == 2);
    TEST_ASSERT(faccessat(g.regfd, t1, F_OK, 0) < 0 && errno == ENOENT);
    TEST_ASSERT(faccessat(g.regfd, young, F_OK, 0) == 0);
    /* a live writer's marker is never swept, however old */
    pid_t p2 = sleeper();
    snprintf(content, sizeof(content), "pid=%d start=%llu\n", (int)p2,
             (unsigned long long)start_of(p2));
    write_marker(g.regfd, "live-marker", content, now - 30 * 86400);
    TEST_ASSERT(kvt_tmpguard_sweep_markers(&g, &swept, &kept) == 0 && swept == 0);
    TEST_ASSERT(faccessat(g.regfd, "live-marker", F_OK, 0) == 0);
    reap(p2);
    kvt_tmpguard_fini(&g);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kvt-tmpguard-%d", (int)getpid());
    TEST_ASSERT(mkdir(dir, 0755) == 0);
    dfd = open(dir, O_RDONLY | O_DIRECTORY);
    TEST_ASSERT(dfd >= 0);
    RUN(test_names);
    RUN(test_liveness);
    RUN(test_classify);
    RUN(test_registry);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    TEST_ASSERT(system(cmd) == 0);
    return TEST_RESULT();
}
