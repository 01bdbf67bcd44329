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

/* Create backend `name` ("ucx", "cma", "cuda_ipc") with options, loading
 * libpdx_backend_<name>.so from PDX_PLUGIN_PATH (colon-separated), then from
 * <dir of libpdx.so>/pdx/ and <dir of libpdx.so>. Create backends before
 * registering memory or loading peers: regions and peers are set up with
 * the backends there are at that time.
 *
 * @param [in]  agent  The agent that will own the instance.
 * @param [in]  name   The module's name: the <name> of its file name.
 * @param [in]  opts   Backend-specific options (nopts of them; NULL when
 *                     nopts is 0); an unknown key is PDX_ERR_CONFIG with a
 *                     log line naming it.
 * @param [in]  nopts  Number of opts.
 * @param [out] be_p   The instance; may be NULL; written only on success.
 * @return PDX_OK; PDX_ERR_NOT_FOUND when no module is found,
 *         PDX_ERR_VERSION when only incompatible ones are (each rejection
 *         logged with its path and reason), PDX_ERR_UNAVAILABLE when the
 *         backend cannot run here (reason logged), PDX_ERR_EXISTS when the
 *         agent has it already, PDX_ERR_INVALID after memory was registered
 *         or a peer loaded, PDX_ERR_TOO_LARGE past 8 backends,
 *         PDX_ERR_CONFIG for its options, or the error of the module's
 *         create.
 * Owns: the caller keeps `name` and `opts` (read during the call only);
 *       the instance (*be_p) is the agent's, valid until pdx_agent_destroy,
 *       never freed by the caller.
 * Blocks: yes: loading the module (dlopen), then, on the agent lock, the
 *       module's create (UCX: its context and worker).
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_backend_create(pdx_agent_h agent, const char *name,
                                        const pdx_option_t *opts,
                                        size_t nopts, pdx_backend_h *be_p);

/* As pdx_backend_create, with an ops table the caller links in (tests,
 * static builds) instead of a module found by name.
 *
 * @param [in]  agent  The agent that will own the instance.
 * @param [in]  ops    A `const pdx_backend_ops_t *` (pdx/backend.h); its
 *                     abi_version and size are checked first.
 * @param [in]  opts   Backend-specific options (nopts of them).
 * @param [in]  nopts  Number of opts.
 * @param [out] be_p   The instance; may be NULL; written only on success.
 * @return As pdx_backend_create; PDX_ERR_VERSION for a table of another
 *         ABI version or shorter than the oldest accepted.
 * Owns: `ops` is borrowed until pdx_agent_destroy returns (it must outlive
 *       the agent); `opts` as pdx_backend_create; the instance is the
 *       agent's.
 * Blocks: yes: on the agent lock, the table's create.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_backend_create_with_ops(pdx_agent_h agent,
                                                 const void *ops,
                                                 const pdx_option_t *opts,
                                                 size_t nopts,
                                                 pdx_backend_h *be_p);

/* Find a backend module without creating it, and ask it whether it can run
 * here. No agent needed.
 *
 * @param [in]  name     The module's name, as for pdx_backend_create.
 * @param [out] caps_p   The module's PDX_BACKEND_CAP_* (pdx/backend.h);
 *                       may be NULL; written once a module is found, even
 *                       when it cannot run here.
 * @param [out] why      "" on PDX_OK; otherwise the reason ("not found in
 *                       ...", "unavailable: no CUDA device"); may be NULL
 *                       when why_len is 0.
 * @param [in]  why_len  Bytes of `why`.
 * @return PDX_OK; PDX_ERR_NOT_FOUND, PDX_ERR_VERSION or
 *         PDX_ERR_UNAVAILABLE, as pdx_backend_create.
 * Owns: the caller keeps `name` and the `why` buffer.
 * Blocks: yes: loading and unloading the module (dlopen, dlclose) and its
 *       query.
 * Threads: any thread.
 */
PDX_API pdx_status_t pdx_backend_probe(const char *name, uint64_t *caps_p,
                                       char *why, size_t why_len);

/* One line describing a backend instance: "<name>: " and the module's own
 * detail (the transports in use, bytes moved).
 *
 * @param [in]  be   The instance.
 * @param [out] buf  The line, NUL-terminated and truncated to `len`; ""
 *                   for a bad handle; nothing is written when buf is NULL
 *                   or len is 0 (an error).
 * @param [in]  len  Bytes of `buf`.
 * Owns: the caller keeps `buf`.
 * Blocks: on the agent lock (the module's describe runs under it).
 * Threads: any thread.
 */
PDX_API void pdx_backend_describe(pdx_backend_h be, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
