/* pdx-validate's names and JSON helpers, below the steps, the nodes, the
 * report and multi-node runs: the names abort plans and what a node did
 * (its "aborted" field) go by, reading a number or a flag of a node's JSON
 * message, and a token list as JSON. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "pd_wire.h"
#include "validate.h"

const char *plan_name(abort_plan_t k)
{
    static const char *const names[] = {"none", "d_load", "d_reject", "p_load",
                                        "p_reject"};
    return names[k];
}

const char *const g_done_names[DONE_KINDS] = {"load", "reject", "after_load"};

size_t jnum(const cJSON *m, const char *k)
{
    double v = pd_json_num(m, k, 0);
    return v > 0 ? (size_t)v : 0;
}

bool jbool(const cJSON *m, const char *k)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, k));
}

cJSON *tokens_json(const uint64_t *t, size_t n)
{
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) {
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)t[i]));
    }
    return a;
}
