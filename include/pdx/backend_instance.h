/* pdx backend instances: an agent's transports, created from a module or a
 * linked-in table, probed and described. The module ABI they are made from
 * is pdx/backend.h. */
#ifndef PDX_BACKEND_INSTANCE_H
#define PDX_BACKEND_INSTANCE_H

#include <pdx/agent.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdx_backend *pdx_backend_h;

/* Create backend `name` ("ucx", "cuda_ipc") with options, loading
 * libpdx_backend_<name>.so from PDX_PLUGIN_PATH (colon-separated), then from
 * <dir of libpdx.so>/pdx/ and <dir of libpdx.so>. PDX_ERR_NOT_FOUND when no
 * module is found, PDX_ERR_VERSION when only incompatible ones are (each
 * rejection logged with its path and reason), PDX_ERR_UNAVAILABLE when the
 * backend cannot run here (reason logged). Create backends before
 * registering memory or loading peers. `*be_p` may be NULL; the handle is
 * owned by the agent. Blocking. */
PDX_API pdx_status_t pdx_backend_create(pdx_agent_h agent, const char *name,
                                        const pdx_option_t *opts,
                                        size_t nopts, pdx_backend_h *be_p);

/* As pdx_backend_create, with an ops table the caller links in (tests,
 * static builds). `ops` must outlive the agent. */
PDX_API pdx_status_t pdx_backend_create_with_ops(pdx_agent_h agent,
                                                 const void *ops,
                                                 const pdx_option_t *opts,
                                                 size_t nopts,
                                                 pdx_backend_h *be_p);

/* Find a backend module without creating it: on PDX_OK, `why` is empty;
 * otherwise a reason ("not found in ...", "unavailable: no CUDA device").
 * `caps_p` (may be NULL) gets the caps. No agent needed; blocking. */
PDX_API pdx_status_t pdx_backend_probe(const char *name, uint64_t *caps_p,
                                       char *why, size_t why_len);

/* One line describing a backend instance (transports in use). */
PDX_API void pdx_backend_describe(pdx_backend_h be, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
