/* libFuzzer target: file/object names read back from storage (start-up
 * scans) for every codec; a decoded name re-encodes to itself. */
#include "key/key.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > KVT_NAME_MAX)
        return 0;
    for (int c = 0; c < 3; c++) {
        kvt_key k;
        if (kvt_key_decode((enum kvt_codec)c, (const char *)data, size, &k))
            continue;
        char name[KVT_NAME_MAX + 1];
        int n = kvt_key_encode((enum kvt_codec)c, &k, name);
        if (n < 0 || strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
            abort();
        /* names are canonical up to hex case and salt; decoding again must agree */
        kvt_key k2;
        if (kvt_key_decode((enum kvt_codec)c, name, (size_t)n, &k2))
            abort();
        kvt_key a, b;
        kvt_key_canon((enum kvt_codec)c, &k, &a);
        kvt_key_canon((enum kvt_codec)c, &k2, &b);
        if (!kvt_key_eq(&a, &b))
            abort();
    }
    return 0;
}
