"""The README tells the truth: every ```c and ```python block of README.md
runs as written (the C program compiled against this build with its
headers and libpdx.so, run, its output checked; the Python block run with
this build's package, its printed line checked against the comment that
says what it prints); nothing in README.md contradicts docs/NIXL.md (the
phrases of the README's old NIXL paragraph are gone, the ones NIXL.md
states are there); every docs/ or configs/ file the README, METRICS.md
and MULTIHOST.md name exists; the multi-host configs load. Run by ctest
(docs_readme) with the build's paths in the environment."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

SRC = os.environ.get("PDX_SOURCE_DIR", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.environ.get("PDX_BUILD_DIR", os.path.join(SRC, "build"))


def read(rel):
    with open(os.path.join(SRC, rel), encoding="utf-8") as f:
        return f.read()


def blocks(text, lang):
    return re.findall(r"^```%s\n(.*?)^```" % lang, text, re.S | re.M)


def test_c_snippets_compile_and_run():
    found = blocks(read("README.md"), "c")
    assert found, "no C block in README.md"
    cc = os.environ.get("PDX_DOCS_CC", os.environ.get("CC", "cc"))
    # A sanitizer build's flags (PDX_DOCS_SAN_FLAGS, from CMake): the
    # example links the sanitizer runtime itself, so ASan starts from its
    # .preinit_array before any library constructor. Preloaded instead,
    # ASan initialises lazily inside the first call it intercepts: that is
    # p11-kit's constructor (libpdx linked libmicrohttpd -> gnutls ->
    # p11-kit; it loads it with dlopen now, only for a metrics endpoint)
    # holding glibc's locale lock in newlocale(), where ASan's dlerror()
    # unlocks it once too often, and the program hangs in exit().
    san = os.environ.get("PDX_DOCS_SAN_FLAGS", "").split()
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        assert "-fsanitize=address" in san, \
            "ASan build without PDX_DOCS_SAN_FLAGS: the example would hang"
    for i, code in enumerate(found):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "example%d.c" % i)
            with open(src, "w") as f:
                f.write(code)
            exe = os.path.join(tmp, "example%d" % i)
            lib = os.path.join(BUILD, "lib")
            r = subprocess.run(
                [cc, "-std=c11", "-Wall", "-Wextra", "-Werror"] + san +
                ["-I" + os.path.join(SRC, "include"), src, "-o", exe,
                 "-L" + lib, "-lpdx", "-Wl,-rpath," + lib],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            assert r.returncode == 0, "README C block %d does not compile:" \
                "\n%s" % (i, r.stdout.decode())
            env = dict(os.environ, UCX_NET_DEVICES="lo")
            env.pop("PDX_LOG_LEVEL", None)
            r = subprocess.run([exe], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=60, env=env)
            out, err = r.stdout.decode(), r.stderr.decode()
            assert r.returncode == 0, (out, err)
            # The fast path, as the text says: cma's memcpy, no warning.
            assert "READ success over cma (memcpy): first byte 42" in out, out
            assert 'got "req-7:1" from glm52-d-dp0' in out, out
            assert "slower path" not in err and "pdx error" not in err, err


def test_python_snippets_run_as_written():
    found = blocks(read("README.md"), "python")
    assert found, "no Python block in README.md"
    for i, code in enumerate(found):
        env = dict(os.environ, UCX_NET_DEVICES="lo")
        r = subprocess.run([sys.executable, "-c", code],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120, env=env, cwd=tempfile.gettempdir())
        out = r.stdout.decode()
        assert r.returncode == 0, "README Python block %d:\n%s%s" % (
            i, out, r.stderr.decode())
        # A `print(...)  # <what it prints>` comment is checked.
        for want in re.findall(r"^\s*print\(.*\)\s*#\s*(.+)$", code, re.M):
            assert want.strip() in out, (want, out)


def test_readme_agrees_with_nixl_md():
    readme, nixl = read("README.md"), read("docs/NIXL.md")
    # What the README's NIXL paragraph used to say, and pdx.nixl does not.
    for false in ('failures are `"ERR"`', "there is no metadata listener",
                  "example.py", "instead of raising",
                  "--system-site-packages .venv"):
        assert false not in readme, "README.md still says %r" % false
    # What both must say.
    for both in ("nixlNoTelemetryError", "listen", "pip install ./python "
                 "./python/nixl_dist", "nixl_cu12", "nixl_cu13"):
        assert both in readme and both in nixl, both
    assert "raises the NIXL error class" in readme
    assert "a failure raises the NIXL class" in nixl


@pytest.mark.parametrize("doc", ["README.md", "docs/METRICS.md",
                                 "docs/MULTIHOST.md", "docs/BENCH.md"])
def test_named_files_exist(doc):
    text = read(doc)
    base = os.path.dirname(doc)
    names = set(re.findall(r"\]\(([^)#\s]+)\)", text))
    names |= set(re.findall(r"`((?:docs|configs|tests|tools|python|"
                            r"scripts|include)/[A-Za-z0-9_./-]+)`", text))
    missing = []
    for n in names:
        if "://" in n or "*" in n or "<" in n:
            continue
        for cand in (os.path.join(SRC, base, n), os.path.join(SRC, n)):
            if os.path.exists(cand.rstrip("/")):
                break
        else:
            missing.append(n)
    assert not missing, "%s names files that do not exist: %s" % (
        doc, sorted(missing))


def test_multihost_configs_load():
    import pdx
    for role in ("prefill", "decode"):
        path = os.path.join(SRC, "configs", "glm52-fp8-mtp",
                            "multihost-%s.json" % role)
        pdx.KVConfig.load(path)
    text = read("docs/MULTIHOST.md")
    assert '"store": {' in text and "cluster_key_file" in text
