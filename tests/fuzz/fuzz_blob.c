/* libFuzzer harness for the metadata blob parser. Half of the inputs get
 * their checksum fixed up so the fuzzer reaches the body parser instead of
 * stopping at the checksum every time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "blob_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[256];
    pdx_blob_t *b = NULL;
    if (pdx_blob_parse(data, size, &b, why, sizeof(why)) == PDX_OK) {
        pdx_blob_free_parsed(b);
    }
    if (size > PDX_BLOB_HEADER_LEN && (data[size - 1] & 1)) {
        uint8_t *copy = malloc(size);
        if (copy == NULL) {
            return 0;
        }
        memcpy(copy, data, size);
        uint64_t body = size - PDX_BLOB_HEADER_LEN;
        uint64_t sum = XXH3_64bits(copy + PDX_BLOB_HEADER_LEN, body);
        for (int i = 0; i < 4; i++) {
            copy[8 + i] = (uint8_t)(body >> (8 * i));
        }
        for (int i = 0; i < 8; i++) {
            copy[16 + i] = (uint8_t)(sum >> (8 * i));
        }
        b = NULL;
        if (pdx_blob_parse(copy, size, &b, why, sizeof(why)) == PDX_OK) {
            pdx_blob_free_parsed(b);
        }
        free(copy);
    }
    return 0;
}
