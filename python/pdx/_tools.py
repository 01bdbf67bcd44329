"""Console commands of an installed pdx (pip): pdx-info, pdx-validate and
pdx-bench run the tools bundled in pdx/_lib/bin (their run path finds the
bundled libpdx.so.0 and its modules; pdx-validate finds the bundled
configs and glm52-pd-node next to itself)."""
import os
import sys

LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")
BIN_DIR = os.path.join(LIB_DIR, "bin")


def _run(tool):
    path = os.path.join(BIN_DIR, tool)
    if not os.access(path, os.X_OK):
        sys.stderr.write("%s: %s is not in this pdx install (a build from "
                         "the source tree has the tools in <build>/bin)\n"
                         % (tool, path))
        sys.exit(127)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [tool] + sys.argv[1:])


def pdx_info():
    _run("pdx-info")


def pdx_validate():
    _run("pdx-validate")


def pdx_bench():
    _run("pdx-bench")


def pdx_hash():
    _run("pdx-hash")
