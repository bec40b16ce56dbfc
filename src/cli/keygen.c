/*
 * kvtier keygen NAME: a CURVE key pair for the server or a client
 * (docs/security.md). NAME.key holds the secret key (mode 0600, created,
 * never overwritten), NAME.pub the public key: the server's is handed to
 * clients, a client's goes into the server's authorized-clients file.
 * Exit 0, 2 for bad usage or an existing file, 1 for an I/O error.
 */
#include "cli/cli.h"
#include "common/secret.h"
#include "kvtier/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

static int write_new(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        fprintf(stderr, "kvtier keygen: %s: %s%s\n", path, kvt_strerror(-e),
                e == EEXIST ? " (keys are never overwritten: remove it or pick another name)" : "");
        return e == EEXIST ? 2 : 1;
    }
    size_t len = strlen(text);
    int rc = 0;
    if (fchmod(fd, mode) || write(fd, text, len) != (ssize_t)len || fsync(fd)) {
        fprintf(stderr, "kvtier keygen: %s: %s\n", path, kvt_strerror(-errno));
        rc = 1;
    }
    close(fd);
    if (rc)
        unlink(path);
    return rc;
}

int kvt_cmd_keygen(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: kvtier keygen NAME\n"
               "  writes a CURVE key pair: NAME.key (secret, mode 0600) and NAME.pub (public).\n"
               "  Server: kvtier server --auth-key NAME.key; clients get NAME.pub\n"
               "  (KVTIER_SERVER_KEY). Client: add NAME.pub's key to the server's\n"
               "  --auth-clients file; the client uses KVTIER_CLIENT_KEY=NAME.key.\n");
        return 0;
    }
    if (argc != 2 || !argv[1][0] || argv[1][0] == '-') {
        fprintf(stderr, "usage: kvtier keygen NAME   (writes NAME.key and NAME.pub)\n");
        return 2;
    }
    if (!zmq_has("curve")) {
        fprintf(stderr, "kvtier keygen: this libzmq has no CURVE support\n");
        return 1;
    }
    size_t nl = strlen(argv[1]);
    char *kpath = malloc(nl + 5), *ppath = malloc(nl + 5);
    char pub[41], sec[41], text[160];
    int rc = 1;
    if (!kpath || !ppath)
        goto out;
    snprintf(kpath, nl + 5, "%s.key", argv[1]);
    snprintf(ppath, nl + 5, "%s.pub", argv[1]);
    if (!access(kpath, F_OK) || !access(ppath, F_OK)) {
        fprintf(stderr, "kvtier keygen: %s exists: keys are never overwritten\n",
                !access(kpath, F_OK) ? kpath : ppath);
        rc = 2;
        goto out;
    }
    /* key files and the authorized-clients file take a line starting with
     * '#' for a comment: make a pair whose keys do not start with one */
    do {
        if (zmq_curve_keypair(pub, sec)) {
            fprintf(stderr, "kvtier keygen: %s\n", kvt_strerror(-errno));
            goto out;
        }
    } while (pub[0] == '#' || sec[0] == '#');
    snprintf(text, sizeof(text), "# kvtier CURVE secret key: keep it private (mode 0600)\n%s\n",
             sec);
    rc = write_new(kpath, text, 0600);
    kvt_secret_wipe(text, sizeof(text));
    kvt_secret_wipe(sec, sizeof(sec));
    if (rc)
        goto out;
    snprintf(text, sizeof(text), "%s\n", pub);
    rc = write_new(ppath, text, 0644);
    if (rc) {
        unlink(kpath);
        goto out;
    }
    printf("wrote %s (secret key) and %s (public key %s)\n", kpath, ppath, pub);
out:
    free(kpath);
    free(ppath);
    return rc;
}
