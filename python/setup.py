"""Builds the pdx extension against a libpdx.so build of this checkout and
bundles that library and its backend modules into the package (pdx/_lib,
found through the extension's $ORIGIN run path; the loader finds the
backends in <dir of libpdx.so>/pdx/).

The build used: $PDX_BUILD_DIR, else <checkout>/build when it holds
lib/libpdx.so, else a Release build made here with CMake in
<checkout>/build-pip."""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def pdx_build_dir():
    env = os.environ.get("PDX_BUILD_DIR")
    if env:
        return os.path.abspath(env)
    default = os.path.join(ROOT, "build")
    if os.path.exists(os.path.join(default, "lib", "libpdx.so")):
        return default
    out = os.path.join(ROOT, "build-pip")
    subprocess.check_call(["cmake", "-S", ROOT, "-B", out,
                           "-DCMAKE_BUILD_TYPE=Release",
                           "-DPython3_EXECUTABLE=" + sys.executable])
    subprocess.check_call(["cmake", "--build", out, "-j",
                           os.environ.get("PDX_BUILD_JOBS", "2"), "--target",
                           "pdx", "pdx_backend_ucx", "pdx_backend_cma",
                           "pdx_backend_cuda_ipc"])
    return out


class BuildWithLib(build_ext):
    """Copies libpdx.so.0 and the backend modules next to the extension."""

    def run(self):
        super().run()
        lib = os.path.join(self.build_dir_pdx, "lib")
        dest = os.path.join(self.build_lib, "pdx", "_lib")
        os.makedirs(os.path.join(dest, "pdx"), exist_ok=True)
        real = os.path.realpath(os.path.join(lib, "libpdx.so.0"))
        shutil.copy2(real, os.path.join(dest, "libpdx.so.0"))
        for m in glob.glob(os.path.join(lib, "pdx", "libpdx_backend_*.so")):
            shutil.copy2(m, os.path.join(dest, "pdx", os.path.basename(m)))


BUILD = pdx_build_dir()
BuildWithLib.build_dir_pdx = BUILD

ext = Extension(
    "pdx._pdx",
    sources=sorted(glob.glob(os.path.join("src", "*.c"))),
    include_dirs=[os.path.join(ROOT, "plugin", "include"),
                  os.path.join(ROOT, "connector", "include")],
    library_dirs=[os.path.join(BUILD, "lib")],
    libraries=["pdx", "dl"],
    runtime_library_dirs=["$ORIGIN/_lib"],
    define_macros=[("_GNU_SOURCE", None)],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror",
                        "-Wno-unused-parameter", "-Wno-format-truncation"],
)

setup(
    packages=["pdx", "pdx._nixl_shim.nixl"],
    package_data={"pdx": []},
    ext_modules=[ext],
    cmdclass={"build_ext": BuildWithLib},
    zip_safe=False,
)
