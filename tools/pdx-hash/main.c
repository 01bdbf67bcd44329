/* pdx-hash: prints vLLM-compatible prefix-cache block hashes (and
 * PegaFlow's tail key) for token ids read from stdin, to check a deployment
 * against vLLM or debug a 0% hit rate. Exit 0 ok, 1 internal error, 2 bad
 * usage or input. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/kv_hash.h>

#include "tool_version.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pdx-hash --algo xxhash_cbor|sha256_cbor --seed S "
            "--block-size N\n"
            "                [--tail] [--lora NAME] [--salt S] < tokens\n"
            "Reads whitespace-separated token ids (0..2^64-1) from stdin and "
            "prints\n"
            "'none <hex>', 'block <i> <hex>' per full block and, with "
            "--tail,\n"
            "'tail <hex>' when the partial tail has a key.\n"
            "  --algo A          xxhash_cbor (vLLM's default) or sha256_cbor\n"
            "  --seed S          the seed vLLM's NONE_HASH comes from "
            "(PYTHONHASHSEED)\n"
            "  --block-size N    tokens per block\n"
            "  --tail            also the partial tail block's key "
            "(PegaFlow's)\n"
            "  --lora NAME       extra key: the LoRA adapter's name\n"
            "  --salt S          extra key: the request's cache salt\n"
            "  --version         pdx-hash's and libpdx.so's versions\n"
            "  -h, --help        this text\n"
            "Exit 0 ok, 1 internal error, 2 bad usage or input.\n");
}

/* Reports bad usage or input; returns the exit status for it. */
__attribute__((format(printf, 1, 2))) static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "pdx-hash: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

/* Parses a whole decimal unsigned 64-bit number; no sign, no junk. */
static int parse_u64(const char *s, uint64_t *v_p) {
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0')
        return -1;
    if (errno == ERANGE)
        return -2;
    *v_p = (uint64_t)v;
    return 0;
}

static char *read_all(FILE *f, size_t *len_p) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf != NULL) {
        len += fread(buf + len, 1, cap - len - 1, f);
        if (ferror(f)) {
            free(buf);
            return NULL;
        }
        if (feof(f))
            break;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, 2 * cap);
            if (nb == NULL) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf != NULL) {
        buf[len] = '\0';
        *len_p = len;
    }
    return buf;
}

int main(int argc, char **argv) {
    if (pdx_tool_version(argc, argv, "pdx-hash")) {
        return 0;
    }
    static const struct option opts[] = {
        {"algo", required_argument, NULL, 'a'},
        {"seed", required_argument, NULL, 's'},
        {"block-size", required_argument, NULL, 'b'},
        {"tail", no_argument, NULL, 't'},
        {"lora", required_argument, NULL, 'l'},
        {"salt", required_argument, NULL, 'c'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *algo_name = NULL, *seed = NULL, *bs_arg = NULL;
    pdx_hash_extra_t extra = {0};
    int want_tail = 0, c;

    opterr = 0; /* messages below name the option as typed */
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'a':
            algo_name = optarg;
            break;
        case 's':
            seed = optarg;
            break;
        case 'b':
            bs_arg = optarg;
            break;
        case 't':
            want_tail = 1;
            break;
        case 'l':
            extra.field_mask |= PDX_HASH_EXTRA_FIELD_LORA_NAME;
            extra.lora_name = optarg;
            break;
        case 'c':
            extra.field_mask |= PDX_HASH_EXTRA_FIELD_CACHE_SALT;
            extra.cache_salt = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            usage(stderr);
            return bad("option '%s' needs a value", argv[optind - 1]);
        default:
            usage(stderr);
            return bad("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad("unexpected argument '%s' (tokens come from stdin)",
                   argv[optind]);
    if (algo_name == NULL)
        return bad("%s", "missing --algo (xxhash_cbor or sha256_cbor)");
    if (seed == NULL)
        return bad("%s", "missing --seed (vLLM's PYTHONHASHSEED)");
    if (bs_arg == NULL)
        return bad("%s", "missing --block-size");
    pdx_hash_algo_t algo;
    if (pdx_hash_algo_from_string(algo_name, &algo) != PDX_OK)
        return bad("unknown --algo '%s' (want xxhash_cbor or sha256_cbor)",
                   algo_name);
    uint64_t bs;
    if (parse_u64(bs_arg, &bs) != 0 || bs == 0 || bs > PDX_HASH_BLOCK_SIZE_MAX)
        return bad("bad block size '%s' (want 1..65536)", bs_arg);

    size_t len;
    char *text = read_all(stdin, &len);
    if (text == NULL) {
        fprintf(stderr, "pdx-hash: cannot read stdin: %s\n", strerror(errno));
        return 1;
    }
    if (strlen(text) != len) {
        free(text);
        return bad("%s", "stdin holds a NUL byte");
    }
    size_t ntok = 0, cap = 1024;
    uint64_t *tok = malloc(cap * sizeof(*tok));
    int rc = 1;
    for (char *save = NULL, *w = strtok_r(text, " \t\r\n\v\f", &save);
         w != NULL && tok != NULL; w = strtok_r(NULL, " \t\r\n\v\f", &save)) {
        uint64_t v;
        int pr = parse_u64(w, &v);
        if (pr != 0) {
            rc = bad("token %zu: '%s' is %s", ntok, w,
                     pr == -2 ? "above 2^64-1"
                              : "not an unsigned decimal integer");
            goto out;
        }
        if (ntok == cap) {
            uint64_t *nt = realloc(tok, 2 * cap * sizeof(*tok));
            if (nt == NULL)
                break;
            tok = nt;
            cap *= 2;
        }
        tok[ntok++] = v;
    }
    if (tok == NULL) {
        fprintf(stderr, "pdx-hash: out of memory\n");
        goto out;
    }

    pdx_hasher_h h;
    pdx_status_t st = pdx_hasher_create(algo, seed, (uint32_t)bs, &h);
    if (st != PDX_OK) {
        fprintf(stderr, "pdx-hash: hasher: %s\n", pdx_status_string(st));
        goto out;
    }
    size_t nmax = ntok / bs, nb;
    pdx_block_hash_t *out = malloc((nmax ? nmax : 1) * sizeof(*out)), tail;
    int has_tail = 0;
    st = out == NULL
             ? PDX_ERR_NOMEM
             : pdx_hasher_hash_blocks(h, tok, ntok, &extra, out, nmax, &nb,
                                      want_tail ? &tail : NULL, &has_tail);
    if (st != PDX_OK) {
        fprintf(stderr, "pdx-hash: hashing: %s\n", pdx_status_string(st));
        goto out_h;
    }
    char hex[PDX_BLOCK_HASH_HEX_MAX];
    pdx_block_hash_t none;
    pdx_hasher_none_hash(h, &none);
    pdx_block_hash_to_hex(&none, hex, sizeof(hex));
    printf("none %s\n", hex);
    for (size_t i = 0; i < nb; i++) {
        pdx_block_hash_to_hex(&out[i], hex, sizeof(hex));
        printf("block %zu %s\n", i, hex);
    }
    if (has_tail) {
        pdx_block_hash_to_hex(&tail, hex, sizeof(hex));
        printf("tail %s\n", hex);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out_h:
    free(out);
    pdx_hasher_destroy(h);
out:
    free(tok);
    free(text);
    return rc;
}
