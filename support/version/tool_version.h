/* --version of pdx's tools and of the example's node, one way: the tool's
 * own version (the project's, compiled in) and the libpdx.so it runs
 * with, which may be another build (PDX's run path, LD_LIBRARY_PATH). */
#ifndef PDX_TOOL_VERSION_H
#define PDX_TOOL_VERSION_H

#include <stdio.h>
#include <string.h>

#include <pdx/pdx.h>

#ifndef PDX_TOOL_VERSION
#define PDX_TOOL_VERSION "0.0.0"
#endif

/* With --version among the arguments (before a "--"): prints
 * "<tool> <version> (libpdx.so <version>, plugin ABI <n>)" and returns 1
 * (the caller exits 0); else 0. */
static inline int pdx_tool_version(int argc, char **argv, const char *tool)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            break;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s (libpdx.so %s, plugin ABI %u)\n", tool,
                   PDX_TOOL_VERSION, pdx_version(), pdx_plugin_v1.abi_version);
            return 1;
        }
    }
    return 0;
}

#endif
