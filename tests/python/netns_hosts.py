"""Hosts for the Python tests, as support/netns makes them for the C tests:
network namespaces joined by veth pairs to a bridge in a hub namespace
(10.77.0.0/24, each host's interface eth0), names tagged with this
process's pid, removed at the end. Nothing is created in the caller's own
namespaces. A worker enters a host with `hosted` (spawned as the worker
function): the host's network namespace (setns) and a pid namespace of
its own (unshare, then fork: the child is pid 1 there and runs the worker
function), so that pdx sees another host (its host id names the pid
namespace): neither cma nor cuda_ipc serves it, UCX over tcp on eth0 does.

Needs root and the `ip` tool (iproute2); `Lab.why_not()` says why not."""
import ctypes
import os
import re
import shutil
import signal
import subprocess

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
HUB_IP = "10.77.0.1"

_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args):
    r = subprocess.run(("ip",) + args, capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        raise OSError("ip %s: %s" % (" ".join(args),
                                     (r.stderr or r.stdout).strip()))


class Lab:
    """A hub and `nhosts` hosts; `host(i)` names host i's namespace and
    `ip(i)` its address. Use as a context manager (removed at exit)."""

    _count = 0

    @staticmethod
    def why_not():
        """Why this machine cannot make hosts, or None."""
        if os.geteuid() != 0:
            return ("not root: network and pid namespaces and veth pairs "
                    "need CAP_SYS_ADMIN and CAP_NET_ADMIN")
        if shutil.which("ip") is None:
            return "no `ip` tool (iproute2) to make network namespaces"
        return None

    @staticmethod
    def _sweep():
        """Remove namespaces left by a test process that died before its
        cleanup (its pid is gone)."""
        r = subprocess.run(("ip", "netns", "list"), capture_output=True,
                           text=True, timeout=30)
        for line in r.stdout.splitlines():
            m = re.match(r"(pdxpy(\d+)-\d+-\S+)", line)
            if m is None or os.path.exists("/proc/" + m.group(2)):
                continue
            subprocess.run(("ip", "netns", "del", m.group(1)),
                           capture_output=True, timeout=30)

    def __init__(self, nhosts):
        self._sweep()
        Lab._count += 1
        self.tag = "pdxpy%d-%d" % (os.getpid(), Lab._count)
        self.hub = self.tag + "-hub"
        self.hosts = []
        self._made = []
        try:
            self._make(nhosts)
        except BaseException:
            self.close()
            raise

    def _make(self, nhosts):
        _ip("netns", "add", self.hub)
        self._made.append(self.hub)
        for a in (("link", "set", "lo", "up"),
                  ("link", "add", "br0", "type", "bridge"),
                  ("addr", "add", HUB_IP + "/24", "dev", "br0"),
                  ("link", "set", "br0", "up")):
            _ip("-n", self.hub, *a)
        for i in range(nhosts):
            h = "%s-h%d" % (self.tag, i)
            _ip("netns", "add", h)
            self._made.append(h)
            self.hosts.append(h)
            _ip("-n", self.hub, "link", "add", "vb%d" % i, "type", "veth",
                "peer", "name", "eth0", "netns", h)
            _ip("-n", self.hub, "link", "set", "vb%d" % i, "master", "br0")
            _ip("-n", self.hub, "link", "set", "vb%d" % i, "up")
            _ip("-n", h, "link", "set", "lo", "up")
            _ip("-n", h, "addr", "add", self.ip(i) + "/24", "dev", "eth0")
            _ip("-n", h, "link", "set", "eth0", "up")

    def host(self, i):
        return self.hosts[i]

    @staticmethod
    def ip(i):
        return "10.77.0.%d" % (11 + i)

    def close(self):
        for ns in reversed(self._made):
            subprocess.run(("ip", "netns", "del", ns), capture_output=True,
                           timeout=30)
        self._made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def enter_host(ns):
    """Move this process into host `ns`: its network namespace, then a new
    pid namespace, which only children enter: fork, the child (pid 1 of
    it) returns and goes on; this process waits for it and exits with its
    status. The child dies with its parent (PR_SET_PDEATHSIG), so killing
    the worker's process kills the host's. Call before pdx or UCX load."""
    fd = os.open("/run/netns/" + ns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), "setns " + ns)
    finally:
        os.close(fd)
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    # The child learns of a parent that died before its PR_SET_PDEATHSIG
    # took from this pipe's end of file.
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(wfd)
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0),
               "prctl")
        import select
        if select.select([rfd], [], [], 0)[0]:
            os._exit(1)
        os.close(rfd)
        # Hosts reach each other over their network only (the kernel's
        # shared memory and cma would cross namespaces).
        os.environ["UCX_NET_DEVICES"] = "eth0"
        os.environ["UCX_TLS"] = "tcp"
        return
    os.close(rfd)
    status = 0
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def hosted(conn, ns, module, func, *args):
    """The worker function for a spawned process in host `ns`: enters it
    (enter_host), then runs module.func(conn, *args)."""
    enter_host(ns)
    import importlib
    fn = getattr(importlib.import_module(module), func)
    fn(conn, *args)
