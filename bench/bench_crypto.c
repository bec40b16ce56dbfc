/*
 * bench_crypto: the physical limit of the CURVE inline rows of
 * `bench/run.sh l1`. ZeroMQ's CURVE seals every frame with libsodium's
 * crypto_box_easy_afternm (XSalsa20-Poly1305) on the I/O thread that owns the
 * connection, and opens it with crypto_box_open_easy_afternm on the other
 * side. This measures both on one thread for 4 MiB frames, beside a memcpy of
 * the same bytes, so a CURVE row can be read against what one core can
 * encrypt at all.
 *
 *   bench_crypto [--mib N] [--rounds R]
 *
 * Last lines: RESULT seal_gbps X / RESULT open_gbps Y / RESULT memcpy_gbps Z
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t mib = 4;
    int rounds = 50;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib"))
            mib = (size_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
    }
    if (sodium_init() < 0 || !mib || rounds < 1) {
        fprintf(stderr, "bench_crypto: bad arguments or libsodium failed to start\n");
        return 2;
    }
    size_t n = mib << 20, cn = n + crypto_box_MACBYTES;
    unsigned char *m = malloc(n), *c = malloc(cn), *d = malloc(n);
    if (!m || !c || !d)
        return 1;
    unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES];
    unsigned char k[crypto_box_BEFORENMBYTES], nonce[crypto_box_NONCEBYTES] = {0};
    crypto_box_keypair(pk, sk);
    if (crypto_box_beforenm(k, pk, sk) != 0)
        return 1;
    randombytes_buf(m, n);
    memset(c, 0, cn); /* every page mapped before timing */
    memset(d, 0, n);
    double best_seal = 1e9, best_open = 1e9, best_copy = 1e9;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        crypto_box_easy_afternm(c, m, n, nonce, k);
        double t2 = now();
        if (crypto_box_open_easy_afternm(d, c, cn, nonce, k) != 0) {
            fprintf(stderr, "bench_crypto: a sealed frame did not open\n");
            return 1;
        }
        double t3 = now();
        memcpy(d, m, n);
        double t4 = now();
        best_seal = t2 - t < best_seal ? t2 - t : best_seal;
        best_open = t3 - t2 < best_open ? t3 - t2 : best_open;
        best_copy = t4 - t3 < best_copy ? t4 - t3 : best_copy;
    }
    if (memcmp(d, m, n) != 0)
        return 1;
    printf("XSalsa20-Poly1305 (libsodium %s), %zu MiB frames, one thread, best of %d: seal %.2f "
           "GB/s, open %.2f GB/s; memcpy %.2f GB/s\n",
           sodium_version_string(), mib, rounds, (double)n / best_seal / 1e9,
           (double)n / best_open / 1e9, (double)n / best_copy / 1e9);
    printf("RESULT seal_gbps %.3f\nRESULT open_gbps %.3f\nRESULT memcpy_gbps %.3f\n",
           (double)n / best_seal / 1e9, (double)n / best_open / 1e9, (double)n / best_copy / 1e9);
    free(m);
    free(c);
    free(d);
    return 0;
}
