"""pip install of the pdx package from a clean clone of the committed
tree (git clone of the checkout) into a fresh venv made with
`python3 -m venv --system-site-packages`, no package index: the install
bundles libpdx.so, every backend module and the etcd store module, and
the console commands pdx-info, pdx-validate and pdx-bench; the same pip
command installs python/nixl_dist (pdx in NIXL's place: nixl, nixl_cu12,
nixl_cu13, importlib.metadata.version("nixl")) and pdx.vllm (vLLM's
kv_connector_module_path; importable without vLLM). From the
venv (outside any checkout, no PYTHONPATH or PDX_PLUGIN_PATH), an
Agent(store={"type": "etcd", ...}) against a private etcd publishes and
finds itself by name with the bundled store module, and the venv's
pdx-info runs the bundled tool. setup.py builds libpdx.so and the tools
with CMake in the clone (nothing of this build tree is used).
(Without git, or outside a git checkout, the tree is copied without its
build outputs.) Skipped, with the reason, without cmake, etcd or the venv
module."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from test_store import etcd  # noqa: F401  (the private etcd fixture)

SRC = os.environ.get("PDX_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))))
STEP = 540  # the whole test must fit the ctest timeout (600 s)


def _clean_env():
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PDX_PLUGIN_PATH", "PDX_BUILD_DIR",
              "LD_LIBRARY_PATH", "PDX_CONFIG_DIR", "LD_PRELOAD"):
        env.pop(k, None)
    env["UCX_NET_DEVICES"] = "lo"
    return env


def _run(cmd, cwd, env, timeout=STEP):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, "%s exited %d:\n%s" % (
        " ".join(cmd), p.returncode, out[-6000:])
    return out


CHECK = r'''
import os, sys, pdx
url, ns = sys.argv[1], sys.argv[2]
pkg = os.path.dirname(pdx.__file__)
assert pkg.startswith(sys.prefix), (pkg, sys.prefix)
store = {"type": "etcd", "endpoints": url, "namespace": ns,
         "lease_ttl_ms": 3000, "timeout_ms": 1000}
with pdx.Agent("pip-a", backends=["ucx", "cma"], store=store) as a, \
     pdx.Agent("pip-b", backends=["ucx"], store=store) as b:
    a.register(pdx.mem_alloc(1 << 16))
    a.publish()
    assert b.fetch_peer("pip-a", timeout=10) == "pip-a"
    assert b.peer_state("pip-a") == "alive"
    st = b.store_status()
    assert st["reachable"] and st["endpoint"] == url, st
    maps = open("/proc/self/maps").read()
    for m in ("libpdx.so.0", "libpdx_backend_ucx.so",
              "libpdx_backend_cma.so", "libpdx_store_etcd.so"):
        paths = {l.split()[-1] for l in maps.splitlines()
                 if l.endswith("/" + m)}
        assert paths and all(p.startswith(pkg + "/_lib") for p in paths), \
            (m, paths)
print("pip-ok", pkg)
'''


NIXL_CHECK = r'''
import importlib, importlib.metadata, os, sys
import pdx, pdx.nixl
v = importlib.metadata.version("nixl")
assert tuple(int(x) for x in v.split(".")[:2]) >= (1, 4), v
for name in ("nixl", "nixl_cu12", "nixl_cu13"):
    api = importlib.import_module(name + "._api")
    assert api.nixl_agent is pdx.nixl.nixl_agent, name
    b = importlib.import_module(name + "._bindings")
    assert b.nixlRemoteDisconnectError is pdx.nixl.nixlRemoteDisconnectError
    m = importlib.import_module(name)
    assert m.__file__.startswith(sys.prefix), (name, m.__file__)
importlib.import_module("nixl._utils")
importlib.import_module("nixl.logging")
from nixl._api import nixl_agent, nixl_agent_config
a = nixl_agent("pip-nixl", nixl_agent_config(backends=["UCX"]))
assert "UCX" in a.get_plugin_list()
buf = bytearray(4096)
a.register_memory(a.get_reg_descs([(pdx.addr_of(buf), 4096, 0, "")], "DRAM"))
print("nixl-ok", v)
'''


VLLM_CHECK = r'''
import importlib, sys
import pdx.vllm
assert pdx.vllm.__file__.startswith(sys.prefix), pdx.vllm.__file__
importlib.import_module("pdx.vllm.proxy")
assert not pdx.vllm.VLLM_AVAILABLE  # no vLLM here
try:
    pdx.vllm.PdxConnector(None, None)
    raise SystemExit("PdxConnector built without vLLM")
except ImportError as e:
    assert "needs vLLM" in str(e), e
print("vllm-ok")
'''


def test_pip_install_clean_clone(etcd):  # noqa: F811
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            pytest.skip("%s not installed" % tool)
    try:
        import venv  # noqa: F401
        import ensurepip  # noqa: F401
    except ImportError:
        pytest.skip("python3-venv not installed (venv/ensurepip missing)")
    tmp = tempfile.mkdtemp(prefix="pdx-pip-")
    env = _clean_env()
    try:
        clone = os.path.join(tmp, "src")
        in_git = shutil.which("git") and subprocess.run(
            ["git", "-C", SRC, "rev-parse", "--git-dir"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        if in_git:
            _run(["git", "clone", "-q", "--no-hardlinks", SRC, clone], tmp,
                 env)
        else:
            # A source tree that is no git checkout (a release tarball):
            # a copy without build outputs.
            shutil.copytree(SRC, clone, symlinks=True,
                            ignore=shutil.ignore_patterns(
                                "build*", ".venv*", "*.egg-info",
                                "__pycache__"))
        venv_dir = os.path.join(tmp, "venv")
        _run([sys.executable, "-m", "venv", "--system-site-packages",
              venv_dir], tmp, env)
        pip = os.path.join(venv_dir, "bin", "pip")
        env["PDX_BUILD_JOBS"] = "2"
        # The documented one command: pdx and the 'nixl' distribution
        # (pdx in NIXL's place).
        _run([pip, "install", "-q", "--no-build-isolation", "--no-index",
              os.path.join(clone, "python"),
              os.path.join(clone, "python", "nixl_dist")], tmp, env)
        py = os.path.join(venv_dir, "bin", "python")
        site = _run([py, "-c", "import os, pdx; "
                     "print(os.path.dirname(pdx.__file__))"], tmp,
                    env).strip().splitlines()[-1]
        assert site.startswith(venv_dir), site
        mods = sorted(os.path.basename(m) for m in
                      glob.glob(os.path.join(site, "_lib", "pdx", "*.so")))
        print("bundled modules:", mods)
        for m in ("libpdx_backend_ucx.so", "libpdx_backend_cma.so",
                  "libpdx_store_etcd.so"):
            assert m in mods, (m, mods)
        built = sorted(os.path.basename(m) for m in glob.glob(
            os.path.join(clone, "build-pip", "lib", "pdx", "*.so")))
        assert set(built) <= set(mods), (built, mods)
        out = _run([py, "-c", CHECK, etcd, "pip-%d" % os.getpid()],
                   tmp, env, timeout=120)
        assert "pip-ok" in out, out
        out = _run([py, "-c", NIXL_CHECK], tmp, env, timeout=120)
        assert "nixl-ok" in out, out
        # vLLM's kv_connector_module_path "pdx.vllm": installed by the same
        # command, importable without vLLM, its proxy runnable.
        out = _run([py, "-c", VLLM_CHECK], tmp, env, timeout=60)
        assert "vllm-ok" in out, out
        out = _run([py, "-m", "pdx.vllm.proxy", "--help"], tmp, env,
                   timeout=60)
        assert "usage: python -m pdx.vllm.proxy" in out, out
        # The console commands: the bundled tools with the bundled library.
        info = _run([os.path.join(venv_dir, "bin", "pdx-info")], tmp, env,
                    timeout=60)
        print(info)
        assert "ucx: available" in info and "cma: available" in info, info
        for tool in ("pdx-bench", "pdx-validate"):
            p = subprocess.run([os.path.join(venv_dir, "bin", tool),
                                "--help"], cwd=tmp, env=env, timeout=60,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            assert b"usage: " + tool.encode() in p.stdout, (tool, p.stdout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
