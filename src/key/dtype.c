/* Element type names of the protocol's "dtype" field. */
#include "key/key.h"
#include "common/util.h"

#include <strings.h>

static const char *const dtype_names[] = {"raw",     "float16",     "bfloat16",
                                          "float32", "float8_e4m3", "uint8"};

const char *kvt_dtype_name(unsigned d)
{
    return d <= KVT_DTYPE_MAX ? dtype_names[d] : "unknown";
}

int kvt_dtype_parse(const char *s)
{
    static const struct {
        const char *n;
        int v;
    } alias[] = {{"fp16", KVT_DTYPE_FP16}, {"half", KVT_DTYPE_FP16},  {"bf16", KVT_DTYPE_BF16},
                 {"fp32", KVT_DTYPE_FP32}, {"float", KVT_DTYPE_FP32}, {"fp8", KVT_DTYPE_FP8_E4M3},
                 {"bytes", KVT_DTYPE_RAW}};
    for (unsigned i = 0; i <= KVT_DTYPE_MAX; i++)
        if (strcasecmp(s, dtype_names[i]) == 0)
            return (int)i;
    for (size_t i = 0; i < KVT_ARRAY_LEN(alias); i++)
        if (strcasecmp(s, alias[i].n) == 0)
            return alias[i].v;
    return -1;
}
