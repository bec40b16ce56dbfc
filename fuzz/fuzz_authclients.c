/* libFuzzer target: the authorized-clients file parser (server/auth.h):
 * any bytes either parse into a table whose every entry is well formed, or
 * fail with a message. */
#include "server/auth.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvt_auth *a = NULL;
    char err[1024] = "";
    if (kvt_auth_parse((const char *)data, size, "fuzz", &a, err, sizeof(err)) == 0) {
        if (!a || !a->n)
            abort();
        for (uint32_t i = 0; i < a->n; i++) {
            const struct kvt_auth_client *c = &a->c[i];
            if (strlen(c->key) != 40 || !c->name[0] || (c->any_tenant && c->ntenants))
                abort();
            for (uint32_t t = 0; t < c->ntenants; t++)
                if (strlen(c->tenants[t]) > 128 || strpbrk(c->tenants[t], "@/\\"))
                    abort();
            (void)kvt_auth_salt_ok(c, "");
        }
        kvt_auth_free(a);
    } else if (!err[0] || a) {
        abort(); /* every error has a message and leaves no table */
    }
    return 0;
}
