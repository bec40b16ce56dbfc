/* libFuzzer target: the --l2-adapter JSON parser (every adapter type's
 * field validation; parsing never touches storage). */
#include "l2/adapters.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    struct kvt_l2_spec spec;
    char err[1024];
    if (kvt_l2_spec_parse(text, 0, &spec, err, sizeof(err)) == 0)
        kvt_l2_spec_free(&spec);
    else if (!err[0])
        abort(); /* every error has a message */
    free(text);
    return 0;
}
