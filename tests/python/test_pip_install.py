"""The README's install, exactly: from a clean clone of the committed tree
(git clone of the checkout), a plain venv (`python3 -m venv`, no
--system-site-packages: no numpy, no setuptools build step) and the one
documented command `pip install ./python ./python/nixl_dist` (pdx in
NIXL's place), with no package index (none is reachable here, and the
command needs none: the build backend is in the tree, standard library
and CMake only). The install bundles libpdx.so, every backend module and
the etcd store module, and the console commands pdx-info, pdx-hash,
pdx-validate and pdx-bench. From the venv (outside any checkout, no
PYTHONPATH or PDX_PLUGIN_PATH): numpy is absent, `import pdx` and
`import nixl` (and nixl_cu12, nixl_cu13) give pdx, a nixl_agent moves
bytes between two agents, an Agent(store={"type": "etcd", ...}) against a
private etcd publishes and finds itself by name with the bundled store
module, every console command answers --version, and pdx.vllm (vLLM's
kv_connector_module_path) imports without vLLM. The backend builds
libpdx.so, the tools and the extension with CMake in the clone's
build-pip (nothing of this build tree is used). (Without git, or outside
a git checkout, the tree is copied without its build outputs.) Skipped,
with the reason, without cmake, etcd or the venv module."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from conftest import missing_dep
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
import importlib, importlib.metadata, os, sys, time
try:
    import numpy
    raise SystemExit("numpy importable: not a plain venv")
except ImportError:
    pass
import nixl  # first, as a stack does: it brings pdx
import pdx, pdx.nixl
assert nixl.nixl_agent is pdx.nixl.nixl_agent
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
b = nixl_agent("pip-nixl-d", nixl_agent_config(backends=["UCX"]))
assert "UCX" in a.get_plugin_list()
src = pdx.mem_alloc(1 << 16)
memoryview(src)[:] = bytes(range(256)) * 256
dst = bytearray(1 << 16)
a.register_memory(a.get_reg_descs([(src.addr, 1 << 16, 0, "")], "DRAM"))
b.register_memory(b.get_reg_descs([(pdx.addr_of(dst), 1 << 16, 0, "")],
                                  "DRAM"))
peer = b.add_remote_agent(a.get_agent_metadata())
loc = b.prep_xfer_dlist("NIXL_INIT_AGENT", [(pdx.addr_of(dst) + i * 4096,
                                             4096, 0) for i in range(16)],
                        "DRAM")
rem = b.prep_xfer_dlist(peer, [(src.addr + i * 4096, 4096, 0)
                               for i in range(16)], "DRAM")
h = b.make_prepped_xfer("READ", loc, list(range(16)), rem,
                        list(range(15, -1, -1)), b"pip")
b.transfer(h)
end = time.monotonic() + 30
while b.check_xfer_state(h) == "PROC" and time.monotonic() < end:
    time.sleep(0.001)
assert b.check_xfer_state(h) == "DONE"
for i in range(16):
    assert dst[i * 4096:(i + 1) * 4096] == \
        bytes(memoryview(src)[(15 - i) * 4096:(16 - i) * 4096]), i
assert "numpy" not in sys.modules
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
            missing_dep("%s not installed" % tool)
    try:
        import venv  # noqa: F401
        import ensurepip  # noqa: F401
    except ImportError:
        missing_dep("python3-venv not installed (venv/ensurepip missing)")
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
        _run([sys.executable, "-m", "venv", venv_dir], tmp, env)
        pip = os.path.join(venv_dir, "bin", "pip")
        env["PDX_BUILD_JOBS"] = "2"
        # The documented one command, as written (run in the clone): pdx
        # and the 'nixl' distribution (pdx in NIXL's place).
        _run([pip, "install", "./python", "./python/nixl_dist"], clone, env)
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
        for tool in ("pdx-info", "pdx-hash", "pdx-bench", "pdx-validate"):
            exe = os.path.join(venv_dir, "bin", tool)
            out = _run([exe, "--version"], tmp, env, timeout=60)
            assert out.startswith(tool + " "), (tool, out)
            p = subprocess.run([exe, "--help"], cwd=tmp, env=env,
                               timeout=60, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            assert p.returncode == 0 and b"usage: " + tool.encode() in \
                p.stdout, (tool, p.returncode, p.stdout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
