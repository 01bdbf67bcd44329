"""pdx's PEP 517 build backend, in the tree (pyproject.toml's backend-path):
it needs the standard library and CMake only, so `pip install ./python`
works in a plain venv with no package index (no setuptools, no wheel).

One build of everything: CMake builds libpdx.so, its modules, the tools and
the extension pdx._pdx (python/CMakeLists.txt, the only place its sources
are listed); this backend packs what that build made into a wheel:

* pdx/*.py, pdx/nixl/*.py, and pdx/_nixl_shim/{nixl,nixl_cu12,nixl_cu13}
  (from python/nixl_dist, the one source of the 'nixl' modules);
* pdx/_pdx.<ext suffix>, its run path set to $ORIGIN/_lib;
* pdx/_lib/libpdx.so.0, every module libpdx.so loads from
  <dir of libpdx.so>/pdx/ (libpdx_backend_*.so, libpdx_store_*.so), the
  tools in pdx/_lib/bin (run paths $ORIGIN/..), the deployment configs in
  pdx/_lib/share/pdx/configs (where pdx-validate looks);
* console commands (pdx-info, pdx-hash, pdx-bench, pdx-validate).

The build used: $PDX_BUILD_DIR when set (configured already, or configured
here), else <checkout>/build-pip, configured here (Release, this
interpreter) when it has no CMakeCache.txt; $PDX_BUILD_JOBS jobs (default
2). The same module builds the 'nixl' distribution (python/nixl_dist, pure
Python: its modules under their own names, importlib.metadata.version
("nixl") answered).

No sdist: pdx's sources are the whole checkout, not python/; install from
the checkout. No editable install: use PYTHONPATH=<build>/python."""
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
ROOT = os.path.dirname(PYDIR)
NIXL_SRC = os.path.join(PYDIR, "nixl_dist")
NIXL_PACKAGES = ("nixl", "nixl_cu12", "nixl_cu13")

# Targets of the CMake build the wheel carries, and what each makes.
MODULE_TARGETS = ["pdx_backend_ucx", "pdx_backend_cma",
                  "pdx_backend_cuda_ipc", "pdx_store_etcd"]
TOOLS = ["pdx-info", "pdx-hash", "pdx-bench", "pdx-validate",
         "glm52-pd-node"]


# ---- pyproject.toml ([project] of the simple form these files use) -------

def _toml(path):
    try:
        import tomllib
        with open(path, "rb") as f:
            return tomllib.load(f)
    except ImportError:  # Python < 3.11: the subset pdx's files use
        return _toml_subset(path)


def _toml_value(v):
    v = v.strip()
    if v.startswith('"'):
        return v[1:v.rindex('"')]
    if v.startswith("["):
        return re.findall(r'"([^"]*)"', v)
    if v.startswith("{"):
        return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', v))
    return v


def _toml_subset(path):
    doc, cur = {}, None
    cur = doc
    for line in open(path, encoding="utf-8"):
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"\[([^\]]+)\]$", line)
        if m:
            cur = doc
            for part in m.group(1).split("."):
                cur = cur.setdefault(part.strip('"'), {})
            continue
        k, _, v = line.partition("=")
        cur[k.strip().strip('"')] = _toml_value(v)
    return doc


def _project(src_dir):
    return _toml(os.path.join(src_dir, "pyproject.toml"))["project"]


# ---- wheel writing ---------------------------------------------------------

def _dist_name(name):
    return re.sub(r"[-_.]+", "_", name)


def _metadata_text(proj):
    lines = ["Metadata-Version: 2.1", "Name: " + proj["name"],
             "Version: " + proj["version"]]
    if "description" in proj:
        lines.append("Summary: " + proj["description"])
    if "requires-python" in proj:
        lines.append("Requires-Python: " + proj["requires-python"])
    for dep in proj.get("dependencies", []):
        lines.append("Requires-Dist: " + dep)
    for extra, deps in proj.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    return "\n".join(lines) + "\n"


def _entry_points_text(proj):
    scripts = proj.get("scripts", {})
    if not scripts:
        return None
    return "[console_scripts]\n" + "".join(
        "%s = %s\n" % (k, v) for k, v in sorted(scripts.items()))


def _tag(pure):
    if pure:
        return "py3-none-any"
    impl = "cp" if sys.implementation.name == "cpython" else \
        sys.implementation.name[:2]
    ver = "%d%d" % sys.version_info[:2]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s%s-%s%s%s-%s" % (impl, ver, impl, ver,
                               getattr(sys, "abiflags", ""), plat)


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(
        hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arc, digest, len(data))


def _write_dist_info(directory, proj, tag, pure):
    """The .dist-info folder's files (without RECORD) as {name: bytes}."""
    files = {
        "METADATA": _metadata_text(proj).encode(),
        "WHEEL": ("Wheel-Version: 1.0\nGenerator: pdx_build\n"
                  "Root-Is-Purelib: %s\nTag: %s\n"
                  % ("true" if pure else "false", tag)).encode(),
    }
    ep = _entry_points_text(proj)
    if ep:
        files["entry_points.txt"] = ep.encode()
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
        for n, data in files.items():
            with open(os.path.join(directory, n), "wb") as f:
                f.write(data)
    return files


def _write_wheel(wheel_directory, proj, pure, members):
    """members: [(archive name, source path)]. Returns the wheel's name."""
    tag = _tag(pure)
    base = "%s-%s" % (_dist_name(proj["name"]), proj["version"])
    info = base + ".dist-info"
    name = "%s-%s.whl" % (base, tag)
    out = os.path.join(wheel_directory, name)
    record = []
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, src in sorted(members):
            with open(src, "rb") as f:
                data = f.read()
            zi = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if os.access(src, os.X_OK) else 0o644
            zi.external_attr = (0o100000 | mode) << 16
            z.writestr(zi, data)
            record.append(_record_line(arc, data))
        for n, data in sorted(_write_dist_info(None, proj, tag,
                                               pure).items()):
            arc = info + "/" + n
            z.writestr(zipfile.ZipInfo(arc, (2020, 1, 1, 0, 0, 0)), data)
            record.append(_record_line(arc, data))
        record.append(info + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(info + "/RECORD", (2020, 1, 1, 0, 0, 0)),
                   "\n".join(record) + "\n")
    return name


def _tree(src, arc_prefix):
    """[(archive name, path)] of the .py files under src."""
    out = []
    for d, dirs, files in os.walk(src):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                rel = os.path.relpath(p, src).replace(os.sep, "/")
                out.append((arc_prefix + rel, p))
    return out


def _nixl_members(arc_prefix):
    out = []
    for pkg in NIXL_PACKAGES:
        out += _tree(os.path.join(NIXL_SRC, pkg), arc_prefix + pkg + "/")
    return out


# ---- the CMake build -------------------------------------------------------

def _log(msg):
    sys.stderr.write("pdx_build: %s\n" % msg)
    sys.stderr.flush()


def _run(cmd):
    _log(" ".join(cmd))
    subprocess.check_call(cmd, stdout=sys.stderr)


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        raise RuntimeError("pdx_build: cmake not found (apt-get install "
                           "cmake, or run scripts/deps.sh)")
    return exe


def _build_dir():
    """The configured CMake build this wheel is made from."""
    env = os.environ.get("PDX_BUILD_DIR")
    out = os.path.abspath(env) if env else os.path.join(ROOT, "build-pip")
    if not os.path.exists(os.path.join(out, "CMakeCache.txt")):
        _run([_cmake(), "-S", ROOT, "-B", out, "-DCMAKE_BUILD_TYPE=Release",
              "-DPython3_EXECUTABLE=" + sys.executable])
    return out


def _targets(build):
    """The targets this build has ('help' lists them; cuda_ipc is there
    only where the CUDA headers were found)."""
    p = subprocess.run([_cmake(), "--build", build, "--target", "help"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       universal_newlines=True)
    # Makefiles list "... name", Ninja "name: phony".
    have = set(re.findall(r"^(?:\.\.\. )?([\w.+-]+)(?:$|:)", p.stdout,
                          re.M))
    want = [t for t in MODULE_TARGETS if not have or t in have]
    return ["pdx"] + want + TOOLS + ["pdx_python"]


def _build(build):
    jobs = os.environ.get("PDX_BUILD_JOBS", "2")
    _run([_cmake(), "--build", build, "-j", jobs, "--target"] +
         _targets(build))


def _set_rpath(path, rpath):
    """Rewrites an ELF file's run path with CMake (no patchelf needed)."""
    subprocess.check_call([_cmake(), "-DF=" + path, "-DR=" + rpath, "-P",
                           os.path.join(HERE, "cmake_rpath.cmake")],
                          stdout=sys.stderr)


def _pdx_members(build, stage):
    """[(archive name, path)] of the pdx wheel; ELF files are copied to
    `stage` first and their run paths rewritten there."""
    members = _tree(os.path.join(PYDIR, "pdx"), "pdx/")
    members += _nixl_members("pdx/_nixl_shim/")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    ext = os.path.join(build, "python", "pdx", "_pdx" + suffix)
    if not os.path.exists(ext):
        raise RuntimeError(
            "pdx_build: %s was not built: the build %s is configured for "
            "another Python (reconfigure it with -DPython3_EXECUTABLE=%s, "
            "or unset PDX_BUILD_DIR), or python3-dev is missing"
            % (ext, build, sys.executable))

    def staged(src, arc, rpath):
        dst = os.path.join(stage, arc)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.realpath(src), dst)
        if rpath is not None:
            _set_rpath(dst, rpath)
        members.append((arc, dst))

    staged(ext, "pdx/_pdx" + suffix, "$ORIGIN/_lib")
    lib = os.path.join(build, "lib")
    staged(os.path.join(lib, "libpdx.so.0"), "pdx/_lib/libpdx.so.0", None)
    mod_dir = os.path.join(lib, "pdx")
    for m in sorted(os.listdir(mod_dir)):
        if re.match(r"libpdx_(backend|store)_\w+\.so$", m) and \
                m != "libpdx_backend_example.so":
            staged(os.path.join(mod_dir, m), "pdx/_lib/pdx/" + m,
                   "$ORIGIN/..")
    for t in TOOLS:
        src = os.path.join(build, "bin", t)
        if not os.path.exists(src):
            raise RuntimeError("pdx_build: %s not built in %s" % (t, build))
        staged(src, "pdx/_lib/bin/" + t, "$ORIGIN/..")
    cfg = os.path.join(ROOT, "configs")
    for d, _, files in os.walk(cfg):
        for f in sorted(files):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, cfg).replace(os.sep, "/")
            members.append(("pdx/_lib/share/pdx/configs/" + rel, p))
    return members


def _is_nixl(proj):
    return proj["name"] == "nixl"


# ---- PEP 517 hooks ---------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None, src_dir=PYDIR):
    proj = _project(src_dir)
    pure = _is_nixl(proj)
    info = "%s-%s.dist-info" % (_dist_name(proj["name"]), proj["version"])
    _write_dist_info(os.path.join(metadata_directory, info), proj,
                     _tag(pure), pure)
    return info


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None, src_dir=PYDIR):
    proj = _project(src_dir)
    if _is_nixl(proj):
        return _write_wheel(wheel_directory, proj, True, _nixl_members(""))
    build = _build_dir()
    _build(build)
    stage = tempfile.mkdtemp(prefix="pdx-wheel-")
    try:
        return _write_wheel(wheel_directory, proj, False,
                            _pdx_members(build, stage))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build_sdist(sdist_directory, config_settings=None):
    raise RuntimeError(
        "pdx_build: no sdist: pdx's sources are the whole checkout (the C "
        "library, its modules and tools), not python/ alone; install from "
        "the checkout: pip install ./python")
