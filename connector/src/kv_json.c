/* The connector's strict JSON reader (kv_json.h): messages and JSON
 * paths, known keys, scalars, and the checks of the text cJSON leaves
 * out. */
#include "kv_json_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/log.h>

/* ---- messages and JSON paths ---------------------------------------- */

/* The message goes to `err` and, as an error line, to the log (and so to
 * pdx_last_error()), whether or not the caller gave a buffer. */
pdx_status_t kvj_fail_st(kvj_ctx_t *c, pdx_status_t st, const char *fmt, ...)
{
    char msg[1024];
    int n = snprintf(msg, sizeof(msg), "%s: ", c->name);
    if (n >= 0 && (size_t)n < sizeof(msg)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
        va_end(ap);
    }
    if (c->err != NULL && c->err_len > 0)
        snprintf(c->err, c->err_len, "%s", msg);
    pdx_error("kv config %s", msg);
    return st;
}

/* Copies `s` for a message: at most `max` bytes (not cutting a UTF-8
 * sequence, "..." marking a cut), control characters as '?', and quotes
 * and backslashes too unless keep_quotes. */
static void kvj_sanitize_q(const char *s, char *out, size_t outlen, size_t max,
                           int keep_quotes)
{
    size_t n = strlen(s), o = 0;
    int cut = 0;
    if (n > max) {
        n = max;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
        cut = 1;
    }
    for (size_t i = 0; i < n && o + 1 < outlen; i++) {
        unsigned char ch = (unsigned char)s[i];
        int bad = ch < 0x20 || ch == 0x7F ||
                  (!keep_quotes && (ch == '"' || ch == '\\'));
        out[o++] = bad ? '?' : (char)ch;
    }
    for (int k = 0; cut && k < 3 && o + 1 < outlen; k++)
        out[o++] = '.';
    out[o] = '\0';
}

static void kvj_sanitize(const char *s, char *out, size_t outlen, size_t max)
{
    kvj_sanitize_q(s, out, outlen, max, 0);
}

static int is_ident(const char *s)
{
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

size_t kvj_push_key(kvj_ctx_t *c, const char *key)
{
    size_t old = c->path_len;
    char k[72];
    kvj_sanitize(key, k, sizeof(k), 64);
    int n = snprintf(c->path + old, sizeof(c->path) - old,
                     is_ident(key) ? ".%s" : "[\"%s\"]", k);
    if (n > 0)
        c->path_len = old + (size_t)n < sizeof(c->path) ? old + (size_t)n
                                                        : sizeof(c->path) - 1;
    return old;
}

size_t kvj_push_index(kvj_ctx_t *c, size_t i)
{
    size_t old = c->path_len;
    int n = snprintf(c->path + old, sizeof(c->path) - old, "[%zu]", i);
    if (n > 0)
        c->path_len = old + (size_t)n < sizeof(c->path) ? old + (size_t)n
                                                        : sizeof(c->path) - 1;
    return old;
}

void kvj_pop(kvj_ctx_t *c, size_t old)
{
    c->path_len = old;
    c->path[old] = '\0';
}

/* "string \"abc\"", "number 1.5", ... for "got ..." in messages. */
void kvj_describe(const cJSON *v, char *out, size_t len)
{
    char s[48];
    if (cJSON_IsString(v) && v->valuestring != NULL) {
        kvj_sanitize(v->valuestring, s, sizeof(s), 32);
        snprintf(out, len, "string \"%s\"", s);
    } else if (cJSON_IsNumber(v)) {
        snprintf(out, len, "number %.15g", v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        snprintf(out, len, "boolean %s", cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        snprintf(out, len, "null");
    } else if (cJSON_IsArray(v)) {
        snprintf(out, len, "array");
    } else if (cJSON_IsObject(v)) {
        snprintf(out, len, "object");
    } else {
        snprintf(out, len, "an invalid value");
    }
}

pdx_status_t kvj_fail_type(kvj_ctx_t *c, const cJSON *v, const char *expected)
{
    char got[64];
    kvj_describe(v, got, sizeof(got));
    return kvj_fail_at(c, "expected %s, got %s", expected, got);
}

/* ---- objects: known keys, no repeats --------------------------------- */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32)
        return 99;
    size_t row[33];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* `obj` must be an object whose keys are all in `known` (n <= 32), each
 * once. `what` names the object in the unknown-key message. */
pdx_status_t kvj_check_keys(kvj_ctx_t *c, const cJSON *obj,
                            const char *const *known, size_t n,
                            const char *what)
{
    uint32_t seen = 0;
    for (const cJSON *it = obj->child; it != NULL; it = it->next) {
        const char *key = it->string != NULL ? it->string : "";
        size_t k = 0;
        while (k < n && strcmp(known[k], key) != 0)
            k++;
        size_t old = kvj_push_key(c, key);
        if (k == n) {
            char list[320] = "", hint[64] = "";
            size_t best = 99, bi = 0, o = 0;
            for (size_t i = 0; i < n; i++) {
                int w = snprintf(list + o, sizeof(list) - o, "%s%s",
                                 i ? ", " : "", known[i]);
                if (w > 0 && o + (size_t)w < sizeof(list))
                    o += (size_t)w;
                size_t d = edit_distance(key, known[i]);
                if (d < best) {
                    best = d;
                    bi = i;
                }
            }
            if (best <= 2 && best < strlen(key))
                snprintf(hint, sizeof(hint), " (did you mean %s?)", known[bi]);
            return kvj_fail_at(c, "unknown key%s; %s takes: %s", hint, what,
                               list);
        }
        if (seen & (1u << k))
            return kvj_fail_at(c, "%s", "key given twice");
        seen |= 1u << k;
        kvj_pop(c, old);
    }
    return PDX_OK;
}

/* The member called `key` (case-sensitive; kvj_check_keys ruled out
 * repeats). */
const cJSON *kvj_member(const cJSON *obj, const char *key)
{
    if (obj == NULL)
        return NULL;
    for (const cJSON *it = obj->child; it != NULL; it = it->next)
        if (it->string != NULL && strcmp(it->string, key) == 0)
            return it;
    return NULL;
}

/* Enters obj.key, which must be an object (absent: *out NULL, unless
 * required). The caller pops the path with the returned length. */
pdx_status_t kvj_get_object(kvj_ctx_t *c, const cJSON *obj, const char *key,
                            int required, const cJSON **out, size_t *old_p)
{
    const cJSON *v = kvj_member(obj, key);
    *old_p = kvj_push_key(c, key);
    *out = NULL;
    if (v == NULL) {
        if (required)
            return kvj_fail_at(c, "%s", "missing (required: an object)");
        return PDX_OK;
    }
    if (!cJSON_IsObject(v))
        return kvj_fail_type(c, v, "an object");
    *out = v;
    return PDX_OK;
}

/* ---- scalars ---------------------------------------------------------- */

static void int_expect(uint64_t lo, uint64_t hi, char *out, size_t len)
{
    if (hi >= KVJ_INT_MAX) {
        if (lo == 0)
            snprintf(out, len, "a non-negative integer");
        else if (lo == 1)
            snprintf(out, len, "a positive integer");
        else
            snprintf(out, len, "an integer of at least %" PRIu64, lo);
    } else if (lo == 1) {
        snprintf(out, len, "a positive integer up to %" PRIu64, hi);
    } else {
        snprintf(out, len, "an integer from %" PRIu64 " to %" PRIu64, lo, hi);
    }
}

/* An integer JSON number in [lo, hi] (hi <= 2^53) at the current path. */
pdx_status_t kvj_read_uint(kvj_ctx_t *c, const cJSON *v, uint64_t lo,
                           uint64_t hi, uint64_t *out)
{
    char exp[80];
    int_expect(lo, hi, exp, sizeof(exp));
    if (!cJSON_IsNumber(v))
        return kvj_fail_type(c, v, exp);
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d > (double)KVJ_INT_MAX ||
        (double)(uint64_t)d != d)
        return kvj_fail_type(c, v, exp);
    uint64_t u = (uint64_t)d;
    if (u < lo || u > hi)
        return kvj_fail_type(c, v, exp);
    *out = u;
    return PDX_OK;
}

pdx_status_t kvj_get_uint(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          uint64_t lo, uint64_t hi, int required, uint64_t def,
                          uint64_t *out)
{
    const cJSON *v = kvj_member(obj, key);
    size_t old = kvj_push_key(c, key);
    if (v == NULL) {
        if (required) {
            char exp[80];
            int_expect(lo, hi, exp, sizeof(exp));
            return kvj_fail_at(c, "missing (required: %s)", exp);
        }
        *out = def;
    } else {
        pdx_status_t st = kvj_read_uint(c, v, lo, hi, out);
        if (st != PDX_OK)
            return st;
    }
    kvj_pop(c, old);
    return PDX_OK;
}

pdx_status_t kvj_get_u32(kvj_ctx_t *c, const cJSON *obj, const char *key,
                         uint32_t lo, uint32_t hi, int required, uint32_t def,
                         uint32_t *out)
{
    uint64_t u = 0;
    pdx_status_t st = kvj_get_uint(c, obj, key, lo, hi, required, def, &u);
    if (st == PDX_OK)
        *out = (uint32_t)u;
    return st;
}

pdx_status_t kvj_get_bool(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          bool def, bool *out)
{
    const cJSON *v = kvj_member(obj, key);
    size_t old = kvj_push_key(c, key);
    if (v == NULL) {
        *out = def;
    } else if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
    } else {
        return kvj_fail_type(c, v, "true or false");
    }
    kvj_pop(c, old);
    return PDX_OK;
}

int kvj_str_ok(const char *s, enum kvj_str_rule rule)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned ch = *p;
        switch (rule) {
        case KVJ_STR_SEED:
            break;
        case KVJ_STR_ANY:
            if (ch < 0x20 || ch == 0x7F)
                return 0;
            break;
        case KVJ_STR_NAME:
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' ||
                  ch == '-'))
                return 0;
            break;
        case KVJ_STR_LOWER:
            if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                  ch == '_'))
                return 0;
            break;
        }
    }
    return 1;
}

static void str_expect(enum kvj_str_rule rule, size_t min, size_t size,
                       char *out, size_t len)
{
    static const char *const what[] = {"without control characters", "",
                                       "of [A-Za-z0-9._-]", "of [a-z0-9_]"};
    snprintf(out, len, "a string of %zu to %zu bytes%s%s", min, size - 1,
             what[rule][0] ? " " : "", what[rule]);
}

/* A string at the current path into buf[size]. */
pdx_status_t kvj_read_str(kvj_ctx_t *c, const cJSON *v, char *buf, size_t size,
                          size_t min, enum kvj_str_rule rule)
{
    char exp[96];
    str_expect(rule, min, size, exp, sizeof(exp));
    if (!cJSON_IsString(v) || v->valuestring == NULL)
        return kvj_fail_type(c, v, exp);
    size_t n = strlen(v->valuestring);
    if (n < min || n >= size || !kvj_str_ok(v->valuestring, rule))
        return kvj_fail_type(c, v, exp);
    memcpy(buf, v->valuestring, n + 1);
    return PDX_OK;
}

pdx_status_t kvj_get_str(kvj_ctx_t *c, const cJSON *obj, const char *key,
                         char *buf, size_t size, size_t min,
                         enum kvj_str_rule rule, int required, const char *def)
{
    const cJSON *v = kvj_member(obj, key);
    size_t old = kvj_push_key(c, key);
    if (v == NULL) {
        if (required) {
            char exp[96];
            str_expect(rule, min, size, exp, sizeof(exp));
            return kvj_fail_at(c, "missing (required: %s)", exp);
        }
        snprintf(buf, size, "%s", def);
    } else {
        pdx_status_t st = kvj_read_str(c, v, buf, size, min, rule);
        if (st != PDX_OK)
            return st;
    }
    kvj_pop(c, old);
    return PDX_OK;
}

/* One of names[0..n-1] (index into *out), default `def` when absent. */
pdx_status_t kvj_get_enum(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          const char *const *names, size_t n, int required,
                          size_t def, size_t *out)
{
    const cJSON *v = kvj_member(obj, key);
    size_t old = kvj_push_key(c, key);
    char exp[160];
    int o = snprintf(exp, sizeof(exp), "one of");
    for (size_t i = 0; i < n && o > 0 && (size_t)o < sizeof(exp); i++)
        o += snprintf(exp + o, sizeof(exp) - (size_t)o, "%s \"%s\"",
                      i ? "," : "", names[i]);
    if (v == NULL) {
        if (required)
            return kvj_fail_at(c, "missing (required: %s)", exp);
        *out = def;
        kvj_pop(c, old);
        return PDX_OK;
    }
    if (cJSON_IsString(v) && v->valuestring != NULL)
        for (size_t i = 0; i < n; i++)
            if (strcmp(v->valuestring, names[i]) == 0) {
                *out = i;
                kvj_pop(c, old);
                return PDX_OK;
            }
    return kvj_fail_type(c, v, exp);
}

/* "64GiB", "512 MiB", "100GB", "4096": a byte count. 0 on a bad string. */
static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        {"kib", 1ull << 10},
        {"mib", 1ull << 20},
        {"gib", 1ull << 30},
        {"tib", 1ull << 40},
        {"kb", 1000ull},
        {"mb", 1000000ull},
        {"gb", 1000000000ull},
        {"tb", 1000000000000ull},
    };
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (*p == ' ')
        p++;
    /* Units are at most 3 letters ("gib"); the buffer is larger than that
     * so GCC's -O3 bounds analysis sees the copy loop cannot overflow. */
    char unit[8];
    size_t ul = strlen(p);
    if (ul > 3)
        return 0;
    for (size_t i = 0; i <= ul; i++)
        unit[i] =
            (p[i] >= 'A' && p[i] <= 'Z') ? (char)(p[i] - 'A' + 'a') : p[i];
    if (ul == 0 && p != s && p[-1] == ' ')
        return 0; /* "64 " */
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (strcmp(unit, units[i].unit) == 0) {
            if (v > UINT64_MAX / units[i].mult)
                return 0;
            *out = v * units[i].mult;
            return 1;
        }
    return 0;
}

#define SIZE_EXPECT                                                            \
    "a positive byte count: an integer up to 2^53 or a string like "           \
    "\"64GiB\" (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"

pdx_status_t kvj_get_size(kvj_ctx_t *c, const cJSON *obj, const char *key,
                          uint64_t *out)
{
    const cJSON *v = kvj_member(obj, key);
    size_t old = kvj_push_key(c, key);
    if (v == NULL)
        return kvj_fail_at(c, "missing (required: %s)", SIZE_EXPECT);
    if (cJSON_IsString(v) && v->valuestring != NULL) {
        if (!parse_size(v->valuestring, out) || *out == 0)
            return kvj_fail_type(c, v, SIZE_EXPECT);
    } else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (!isfinite(d) || d < 1 || d > (double)KVJ_INT_MAX ||
            (double)(uint64_t)d != d)
            return kvj_fail_type(c, v, SIZE_EXPECT);
        *out = (uint64_t)d;
    } else {
        return kvj_fail_type(c, v, SIZE_EXPECT);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

/* ---- text checks cJSON leaves out --------------------------------- */

static void line_col(const char *text, size_t off, size_t *line_p,
                     size_t *col_p)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)text[i] & 0xC0) != 0x80) {
            col++;
        }
    }
    *line_p = line;
    *col_p = col;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t len;
    uint32_t cp;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        len = 2;
        cp = s[0] & 0x1F;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        len = 3;
        cp = s[0] & 0x0F;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return len;
}

/* JSON rules cJSON does not enforce: UTF-8 text, no NUL byte, no raw
 * control character inside a string, and no \u0000 escape (it would cut
 * a C string short, silently changing e.g. the hash seed). */
static pdx_status_t check_text(kvj_ctx_t *c, const char *text, size_t len,
                               int *open_p)
{
    const unsigned char *s = (const unsigned char *)text;
    int in_str = 0, depth = 0;
    size_t line, col;
    for (size_t i = 0; i < len;) {
        const char *why = NULL;
        size_t step = utf8_len(s + i, len - i);
        if (step == 0) {
            why = "invalid UTF-8";
        } else if (s[i] == 0) {
            why = "NUL byte";
        } else if (in_str && s[i] < 0x20) {
            why = "raw control character in a string (escape it)";
        } else if (in_str && s[i] == '\\') {
            if (i + 5 < len && s[i + 1] == 'u' && s[i + 2] == '0' &&
                s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
                why = "\\u0000 in a string (not supported)";
            else
                step = i + 1 < len ? 2 : 1;
        } else if (s[i] == '"') {
            in_str = !in_str;
        } else if (!in_str && (s[i] == '{' || s[i] == '[')) {
            depth++;
        } else if (!in_str && (s[i] == '}' || s[i] == ']')) {
            depth--;
        }
        if (why != NULL) {
            line_col(text, i, &line, &col);
            return kvj_fail(c, "line %zu, column %zu: %s", line, col, why);
        }
        i += step;
    }
    /* What is still open at the end: a string, or brackets. Only a hint for
     * the syntax error message (cJSON's error offsets are approximate). */
    *open_p = in_str ? -1 : depth > 0 ? depth : 0;
    return PDX_OK;
}

/* ---- the text, parsed ------------------------------------------------ */

pdx_status_t kvj_parse(kvj_ctx_t *c, const char *json, size_t len,
                       cJSON **root_p)
{
    int open = 0;
    pdx_status_t st = check_text(c, json, len, &open);
    if (st != PDX_OK)
        return st;

    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    size_t line, col;
    if (root == NULL) {
        size_t off = end != NULL && end >= json && end <= json + len
                         ? (size_t)(end - json)
                         : len;
        if (open != 0 || off >= len) {
            line_col(json, len, &line, &col);
            if (open < 0)
                return kvj_fail(c,
                                "line %zu, column %zu: JSON syntax error: the "
                                "text ends early, inside a string",
                                line, col);
            if (open > 0)
                return kvj_fail(c,
                                "line %zu, column %zu: JSON syntax error: the "
                                "text ends early, %d unclosed bracket%s",
                                line, col, open, open > 1 ? "s" : "");
            return kvj_fail(c,
                            "line %zu, column %zu: JSON syntax error: the text "
                            "ends early",
                            line, col);
        }
        line_col(json, off, &line, &col);
        char near[24];
        size_t k = 0;
        for (size_t i = off; i < len && k < 16 && json[i] != '\n'; i++)
            near[k++] = json[i];
        near[k] = '\0';
        char safe[40];
        kvj_sanitize_q(near, safe, sizeof(safe), 16, 1);
        return kvj_fail(c, "line %zu, column %zu: JSON syntax error near '%s'",
                        line, col, safe);
    }
    size_t off = (size_t)(end - json);
    while (off < len && (json[off] == ' ' || json[off] == '\t' ||
                         json[off] == '\n' || json[off] == '\r'))
        off++;
    if (off < len) {
        cJSON_Delete(root);
        line_col(json, off, &line, &col);
        return kvj_fail(c,
                        "line %zu, column %zu: JSON syntax error: text after "
                        "the top-level value",
                        line, col);
    }

    *root_p = root;
    return PDX_OK;
}
