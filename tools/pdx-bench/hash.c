/* pdx-bench hash: vLLM-compatible prefix-cache block hashing of long
 * prompts, pdx against vLLM's own recipe run in Python (cbor2 canonical
 * CBOR + xxhash / hashlib), on the same token ids, checking that every
 * block hash is identical. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pdx/kv_hash.h>

#include "bench.h"

#define HASH_SEED "pdx-bench"
#define HASH_BLOCK 64
#define VOCAB 151552 /* GLM tokenizer size: ids need 5-byte CBOR ints */

/* vLLM's recipe, written out: NONE_HASH = H(cbor(seed)); block i =
 * H(cbor((parent, tuple(tokens), None))), parent = previous hash bytes. */
static const char py_script[] =
    "import sys, time\n"
    "try:\n"
    "    import cbor2, xxhash, hashlib\n"
    "except ImportError as e:\n"
    "    print('missing', e.name); sys.exit(3)\n"
    "path, seed, bs, min_s, algo = sys.argv[1], sys.argv[2], "
    "int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]\n"
    "if algo == 'xxhash_cbor':\n"
    "    def H(o):\n"
    "        return xxhash.xxh3_128_digest(cbor2.dumps(o, canonical=True))\n"
    "else:\n"
    "    def H(o):\n"
    "        return hashlib.sha256(cbor2.dumps(o, canonical=True)).digest()\n"
    "NONE_HASH = H(seed)\n"
    "def hash_prompt(tokens):\n"
    "    parent, out = NONE_HASH, []\n"
    "    for i in range(0, len(tokens) - bs + 1, bs):\n"
    "        parent = H((parent, tuple(tokens[i:i + bs]), None))\n"
    "        out.append(parent)\n"
    "    return out\n"
    "with open(path) as f:\n"
    "    prompts = [[int(t) for t in l.split()] for l in f if l.strip()]\n"
    "print('none', NONE_HASH.hex())\n"
    "for p in prompts:\n"
    "    times, end = [], time.perf_counter() + min_s\n"
    "    while True:\n"
    "        t0 = time.perf_counter()\n"
    "        hs = hash_prompt(p)\n"
    "        times.append(time.perf_counter() - t0)\n"
    "        if time.perf_counter() >= end:\n"
    "            break\n"
    "    times.sort()\n"
    "    print('time', len(p), times[0], times[len(times) // 2], "
    "len(times))\n"
    "    for x in hs:\n"
    "        print('h', x.hex())\n"
    "sys.stdout.flush()\n";

static void make_tokens(uint64_t *t, size_t n, uint64_t salt)
{
    uint64_t x = 0x9e3779b97f4a7c15ull ^ salt;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t[i] = x % VOCAB;
    }
}

typedef struct py_result {
    int ok;
    char why[256];
    char none_hex[PDX_BLOCK_HASH_HEX_MAX];
    double best_s[BENCH_MAX_LIST], med_s[BENCH_MAX_LIST];
    int runs[BENCH_MAX_LIST];
    char **hex[BENCH_MAX_LIST]; /* per prompt, per block */
    size_t nhex[BENCH_MAX_LIST];
} py_result_t;

static const char *find_python(const bench_opts_t *o)
{
    if (access(o->python, X_OK) == 0) {
        return o->python;
    }
    return "python3";
}

static void py_free(py_result_t *r, size_t np)
{
    for (size_t p = 0; p < np; p++) {
        for (size_t i = 0; i < r->nhex[p]; i++) {
            free(r->hex[p][i]);
        }
        free(r->hex[p]);
    }
}

static void run_python(const bench_opts_t *o, const char *algo,
                       uint64_t *const *toks, const size_t *ntok, size_t np,
                       double min_s, py_result_t *r)
{
    memset(r, 0, sizeof(*r));
    char script[] = "/tmp/pdx-bench-hash-XXXXXX";
    char tokf[] = "/tmp/pdx-bench-tok-XXXXXX";
    char outf[] = "/tmp/pdx-bench-pyout-XXXXXX";
    int fs = mkstemp(script), ft = mkstemp(tokf), fo = mkstemp(outf);
    if (fs < 0 || ft < 0 || fo < 0) {
        snprintf(r->why, sizeof(r->why), "mkstemp: %s", strerror(errno));
        return;
    }
    FILE *f = fdopen(fs, "w");
    fputs(py_script, f);
    fclose(f);
    f = fdopen(ft, "w");
    for (size_t p = 0; p < np; p++) {
        for (size_t i = 0; i < ntok[p]; i++) {
            fprintf(f, "%llu ", (unsigned long long)toks[p][i]);
        }
        fputc('\n', f);
    }
    fclose(f);
    char bs[16], ms[32];
    snprintf(bs, sizeof(bs), "%d", HASH_BLOCK);
    snprintf(ms, sizeof(ms), "%.3f", min_s);
    const char *py = find_python(o);
    const char *argv[] = {py, script, tokf, HASH_SEED, bs, ms, algo, NULL};
    int pid = spawn_cmd(argv, NULL, fo, -1);
    int status = 0;
    if (pid < 0) {
        snprintf(r->why, sizeof(r->why), "cannot run %s: %s", py,
                 strerror(errno));
        goto out;
    }
    waitpid(pid, &status, 0);
    FILE *in = fopen(outf, "r");
    char line[512];
    int p = -1;
    size_t cap = 0;
    while (in != NULL && fgets(line, sizeof(line), in) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "missing", 7) == 0) {
            snprintf(r->why, sizeof(r->why),
                     "%s lacks Python module %s (Debian: apt-get install -y "
                     "python3-cbor2 python3-xxhash)",
                     py, line + 8);
        } else if (strncmp(line, "none ", 5) == 0) {
            snprintf(r->none_hex, sizeof(r->none_hex), "%s", line + 5);
        } else if (strncmp(line, "time ", 5) == 0 && p + 1 < (int)np) {
            p++;
            unsigned long long n;
            sscanf(line + 5, "%llu %lf %lf %d", &n, &r->best_s[p], &r->med_s[p],
                   &r->runs[p]);
            cap = 0;
        } else if (strncmp(line, "h ", 2) == 0 && p >= 0) {
            if (r->nhex[p] == cap) {
                cap = cap ? cap * 2 : 256;
                r->hex[p] = realloc(r->hex[p], cap * sizeof(char *));
            }
            r->hex[p][r->nhex[p]++] = strdup(line + 2);
        }
    }
    if (in != NULL) {
        fclose(in);
    }
    if (r->why[0] == '\0') {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            snprintf(r->why, sizeof(r->why), "%s exited with %d", py,
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        } else if (p + 1 != (int)np) {
            snprintf(r->why, sizeof(r->why), "%s printed %d of %zu prompts", py,
                     p + 1, np);
        } else {
            r->ok = 1;
        }
    }
out:
    unlink(script);
    unlink(tokf);
    unlink(outf);
    close(fo);
}

/* The prompts of a run: random token ids, one list per --tokens length. */
typedef struct prompts {
    uint64_t *toks[BENCH_MAX_LIST];
    size_t ntok[BENCH_MAX_LIST];
    size_t np;
} prompts_t;

/* What the rows add up to, for the target: the worst pdx/Python ratio of
 * xxhash_cbor, and whether every hash compared was the same. */
typedef struct hash_tally {
    double worst_ratio;
    int all_same, compared;
} hash_tally_t;

/* Prompt `p` hashed by `h` (algorithm `algo`, the first of the two when
 * `first`) for at least `min_s`, its hashes compared with Python's `py`
 * where that ran: a row printed and added to `rows`. */
static void hash_row(pdx_hasher_h h, const char *algo, int first,
                     const prompts_t *pr, size_t p, double min_s,
                     const py_result_t *py, hash_tally_t *tl, cJSON *rows)
{
    size_t ntok = pr->ntok[p];
    size_t nb = ntok / HASH_BLOCK, got;
    pdx_block_hash_t *out = malloc((nb ? nb : 1) * sizeof(*out));
    dvec_t t = {0};
    uint64_t end = pdx_now_ns() + (uint64_t)(min_s * 1e9);
    do {
        uint64_t t0 = pdx_now_ns();
        CHECK(pdx_hasher_hash_blocks(h, pr->toks[p], ntok, NULL, out, nb, &got,
                                     NULL, NULL));
        dvec_push(&t, (double)(pdx_now_ns() - t0) / 1e9);
        sink(out);
    } while (pdx_now_ns() < end);
    double best = quantile(t.v, t.n, 0.0);
    double med = median_of(t.v, t.n);
    double pdx_tps = (double)ntok / best;
    double pdx_med = (double)ntok / med;
    int same = -1;
    double py_tps = 0;
    if (py->ok) {
        py_tps = (double)ntok / py->best_s[p];
        same = py->nhex[p] == got;
        for (size_t i = 0; same && i < got; i++) {
            char hx[PDX_BLOCK_HASH_HEX_MAX];
            pdx_block_hash_to_hex(&out[i], hx, sizeof(hx));
            if (strcmp(hx, py->hex[p][i]) != 0) {
                say("# %s prompt %zu block %zu differs: pdx %s, "
                    "python %s\n",
                    algo, p, i, hx, py->hex[p][i]);
                same = 0;
            }
        }
        tl->compared = 1;
        if (!same) {
            tl->all_same = 0;
        }
        double q = pdx_tps / py_tps;
        if (first && q < tl->worst_ratio) {
            tl->worst_ratio = q;
        }
    }
    char pys[32], rs[16];
    if (py->ok) {
        snprintf(pys, sizeof(pys), "%14.3e", py_tps);
        snprintf(rs, sizeof(rs), "%8.1f", pdx_tps / py_tps);
    } else {
        snprintf(pys, sizeof(pys), "%14s", "n/a");
        snprintf(rs, sizeof(rs), "%8s", "n/a");
    }
    say("%-12s %7zu %7zu %14.3e %s %14.3e %s %8s\n", algo, ntok, got, pdx_tps,
        pys, pdx_med, rs,
        same < 0 ? "n/a"
        : same   ? "same"
                 : "DIFFER");
    cJSON *j = cJSON_CreateObject();
    jstr(j, "algo", algo);
    jnum(j, "tokens", (double)ntok);
    jnum(j, "blocks", (double)got);
    jnum(j, "pdx_tokens_per_s", pdx_tps);
    jnum(j, "pdx_median_tokens_per_s", pdx_med);
    jnum(j, "pdx_ns_per_block", best * 1e9 / (double)(got ? got : 1));
    jnum(j, "pdx_runs", (double)t.n);
    if (py->ok) {
        jnum(j, "python_tokens_per_s", py_tps);
        jnum(j, "python_median_tokens_per_s", (double)ntok / py->med_s[p]);
        jnum(j, "python_runs", py->runs[p]);
        jnum(j, "ratio", pdx_tps / py_tps);
        cJSON_AddBoolToObject(j, "hashes_identical", same == 1);
    } else {
        jstr(j, "python_error", py->why);
    }
    cJSON_AddItemToArray(rows, j);
    dvec_free(&t);
    free(out);
}

/* Every prompt under algorithm `algo` (the first when `first`), pdx and
 * the Python reference; why Python could not run into why_na. */
static void hash_algo(const bench_opts_t *o, const char *algo, int first,
                      const prompts_t *pr, double min_s, hash_tally_t *tl,
                      char *why_na, size_t why_len, cJSON *rows)
{
    pdx_hash_algo_t id;
    CHECK(pdx_hash_algo_from_string(algo, &id));
    pdx_hasher_h h;
    CHECK(pdx_hasher_create(id, HASH_SEED, HASH_BLOCK, &h));
    py_result_t py;
    run_python(o, algo, pr->toks, pr->ntok, pr->np, min_s, &py);
    if (!py.ok) {
        snprintf(why_na, why_len, "%s", py.why);
    }
    pdx_block_hash_t none;
    pdx_hasher_none_hash(h, &none);
    char nhex[PDX_BLOCK_HASH_HEX_MAX];
    pdx_block_hash_to_hex(&none, nhex, sizeof(nhex));
    if (py.ok && strcmp(nhex, py.none_hex) != 0) {
        say("# %s NONE_HASH differs: pdx %s, python %s\n", algo, nhex,
            py.none_hex);
        tl->all_same = 0;
    }
    for (size_t p = 0; p < pr->np; p++) {
        hash_row(h, algo, first, pr, p, min_s, &py, tl, rows);
    }
    py_free(&py, pr->np);
    pdx_hasher_destroy(h);
}

/* The target (pdx >= 50 x Python, identical hashes), printed and into
 * `root`. */
static void hash_target(const hash_tally_t *tl, cJSON *root)
{
    say("\n# targets (ratios from this run)\n");
    cJSON *jt = cJSON_AddArrayToObject(root, "targets");
    cJSON *j = cJSON_CreateObject();
    jstr(j, "target",
         "hash: pdx >= 50 x Python tokens/s (xxhash_cbor, "
         "worst prompt), identical hashes");
    bench_target("hash", "hash >= 50 x Python tokens/s (xxhash_cbor, worst "
                 "prompt)", tl->compared && tl->all_same, tl->worst_ratio,
                 50, 0, !tl->compared ? "not compared"
                        : tl->all_same ? "hashes identical"
                                       : "hashes DIFFER");
    if (!tl->compared) {
        say("  %-62s n/a\n", "hash >= 50 x Python tokens/s, same hashes");
        jstr(j, "status", "n/a");
    } else {
        int met = tl->worst_ratio >= 50.0 && tl->all_same;
        say("  %-62s %8.1f  %s  (hashes %s)\n",
            "hash >= 50 x Python tokens/s (xxhash_cbor, worst prompt)",
            tl->worst_ratio, met ? "MET" : "NOT MET",
            tl->all_same ? "identical" : "DIFFER");
        jnum(j, "value", tl->worst_ratio);
        jnum(j, "goal", 50);
        jstr(j, "status", met ? "met" : "not met");
    }
    cJSON_AddBoolToObject(root, "hashes_identical",
                          tl->compared && tl->all_same);
    cJSON_AddItemToArray(jt, j);
}

int mode_hash(const bench_opts_t *o, cJSON *root)
{
    static const char *const algos[] = {"xxhash_cbor", "sha256_cbor"};
    prompts_t pr = {.np = o->ntokens};
    for (size_t p = 0; p < pr.np; p++) {
        pr.ntok[p] = (size_t)o->tokens[p];
        pr.toks[p] = malloc((pr.ntok[p] ? pr.ntok[p] : 1) * sizeof(uint64_t));
        make_tokens(pr.toks[p], pr.ntok[p], p + 1);
    }
    double min_s = o->quick ? 0.05 : 0.3;
    say("# pdx-bench hash: vLLM prefix-cache block hashes of prompts of "
        "random token ids (vocab %d), block %d tokens, seed '%s', no extra "
        "keys\n",
        VOCAB, HASH_BLOCK, HASH_SEED);
    say("# method: pdx_hasher_hash_blocks over the whole prompt, repeated "
        "for >= %.2f s; the Python reference is vLLM's recipe (NONE_HASH = "
        "H(cbor2.dumps(seed, canonical=True)), block = H(cbor2.dumps((parent,"
        " tuple(tokens), None), canonical=True))) with Debian's "
        "python3-cbor2 and python3-xxhash (hashlib for sha256), the same "
        "token ids, repeated for >= %.2f s in one interpreter; best run and "
        "median run reported, tokens/s from the best; every block hash "
        "compared\n",
        min_s, min_s);
    print_machine_header(root);
    say("%-12s %7s %7s %14s %14s %14s %8s %8s\n", "algo", "tokens", "blocks",
        "pdx tok/s", "python tok/s", "pdx med tok/s", "ratio", "hashes");
    cJSON *rows = cJSON_AddArrayToObject(root, "rows");
    hash_tally_t tl = {.worst_ratio = 1e300, .all_same = 1};
    char why_na[256] = "";
    for (size_t a = 0; a < 2; a++) {
        hash_algo(o, algos[a], a == 0, &pr, min_s, &tl, why_na, sizeof(why_na),
                  rows);
    }
    if (why_na[0] != '\0') {
        say("# python reference n/a: %s\n", why_na);
    }
    hash_target(&tl, root);
    for (size_t p = 0; p < pr.np; p++) {
        free(pr.toks[p]);
    }
    return tl.compared && !tl.all_same ? 1 : 0;
}
