"""Builds the pdx extension against a libpdx.so build of this checkout and
bundles into the package (pdx/_lib):

* libpdx.so.0, found by the extension through its $ORIGIN run path;
* every module libpdx.so loads from <dir of libpdx.so>/pdx/: the backends
  (libpdx_backend_*.so) and the stores (libpdx_store_*.so, etcd);
* the tools pdx-info, pdx-validate, pdx-bench (and glm52-pd-node, which
  pdx-validate starts) in pdx/_lib/bin, run paths rewritten to $ORIGIN/..,
  installed as console commands by pdx._tools;
* the deployment configs in pdx/_lib/share/pdx/configs (where pdx-validate
  looks, relative to itself).

The build used: $PDX_BUILD_DIR, else <checkout>/build when it holds
lib/libpdx.so, else a Release build made here with CMake in
<checkout>/build-pip. Targets missing from the build used are built."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# target -> file it makes, relative to the build dir
TARGETS = {
    "pdx": "lib/libpdx.so.0",
    "pdx_backend_ucx": "lib/pdx/libpdx_backend_ucx.so",
    "pdx_backend_cma": "lib/pdx/libpdx_backend_cma.so",
    "pdx_backend_cuda_ipc": "lib/pdx/libpdx_backend_cuda_ipc.so",
    "pdx_store_etcd": "lib/pdx/libpdx_store_etcd.so",
    "pdx-info": "bin/pdx-info",
    "pdx-validate": "bin/pdx-validate",
    "pdx-bench": "bin/pdx-bench",
    "glm52-pd-node": "bin/glm52-pd-node",
}
TOOLS = ["pdx-info", "pdx-validate", "pdx-bench", "glm52-pd-node"]


def build_targets(out, targets):
    if targets:
        subprocess.check_call(["cmake", "--build", out, "-j",
                               os.environ.get("PDX_BUILD_JOBS", "2"),
                               "--target"] + targets)


def pdx_build_dir():
    env = os.environ.get("PDX_BUILD_DIR")
    default = os.path.join(ROOT, "build")
    if env:
        out = os.path.abspath(env)
    elif os.path.exists(os.path.join(default, "lib", "libpdx.so")):
        out = default
    else:
        out = os.path.join(ROOT, "build-pip")
        if not os.path.exists(os.path.join(out, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", out,
                                   "-DCMAKE_BUILD_TYPE=Release",
                                   "-DPython3_EXECUTABLE=" + sys.executable])
    missing = [t for t, f in TARGETS.items()
               if not os.path.exists(os.path.join(out, f))]
    build_targets(out, missing)
    return out


def set_rpath(path, rpath):
    """Rewrites an ELF file's run path with CMake (no patchelf needed)."""
    subprocess.check_call(["cmake", "-DF=" + path, "-DR=" + rpath, "-P",
                           os.path.join(HERE, "cmake_rpath.cmake")])


class BuildWithLib(build_ext):
    """Copies libpdx.so.0, the modules, the tools and the configs next to
    the extension."""

    def run(self):
        super().run()
        build = self.build_dir_pdx
        lib = os.path.join(build, "lib")
        dest = os.path.join(self.build_lib, "pdx", "_lib")
        for d in ("pdx", "bin"):
            os.makedirs(os.path.join(dest, d), exist_ok=True)
        real = os.path.realpath(os.path.join(lib, "libpdx.so.0"))
        shutil.copy2(real, os.path.join(dest, "libpdx.so.0"))
        mods = glob.glob(os.path.join(lib, "pdx", "libpdx_backend_*.so")) + \
            glob.glob(os.path.join(lib, "pdx", "libpdx_store_*.so"))
        for m in mods:
            out = os.path.join(dest, "pdx", os.path.basename(m))
            shutil.copy2(m, out)
            set_rpath(out, "$ORIGIN/..")
        for t in TOOLS:
            src = os.path.join(build, TARGETS[t])
            if not os.path.exists(src):
                raise RuntimeError("%s not built in %s" % (t, build))
            out = os.path.join(dest, "bin", t)
            shutil.copy2(src, out)
            set_rpath(out, "$ORIGIN/..")
        cfg = os.path.join(dest, "share", "pdx", "configs")
        if os.path.exists(cfg):
            shutil.rmtree(cfg)
        shutil.copytree(os.path.join(ROOT, "configs"), cfg)


BUILD = pdx_build_dir()
BuildWithLib.build_dir_pdx = BUILD

ext = Extension(
    "pdx._pdx",
    sources=sorted(glob.glob(os.path.join("src", "*.c"))),
    include_dirs=[os.path.join(ROOT, "include"),
                  os.path.join(ROOT, "common")],
    library_dirs=[os.path.join(BUILD, "lib")],
    libraries=["pdx", "dl"],
    runtime_library_dirs=["$ORIGIN/_lib"],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror",
                        "-Wno-unused-parameter", "-Wno-format-truncation"],
)

setup(
    packages=["pdx", "pdx.nixl", "pdx._nixl_shim.nixl", "pdx._nixl_shim.nixl_cu12",
              "pdx._nixl_shim.nixl_cu13", "pdx.vllm"],
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithLib},
    zip_safe=False,
)
