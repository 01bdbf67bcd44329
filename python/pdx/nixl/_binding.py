"""pdx.nixl: nixl._bindings' low-level agent (nixlAgent,
nixlAgentConfig) on a pdx.Agent."""

import sys
import threading
import time

import pdx as _pdx
from ._common import (  # noqa: F401
    _QUERY_PLUGINS,
    _query_file,
    nixlNotSupportedError,
    DEFAULT_COMM_PORT,
    NIXL_READ,
    NIXL_WRITE,
    _PLUGIN_PARAMS,
    _env_flag,
    _name,
    _notif_bytes,
    nixlInvalidParamError,
    nixlNoTelemetryError,
    nixlNotFoundError,
    nixlXferTelemetry,
)


class nixlAgentConfig:
    """nixl._bindings.nixlAgentConfig: the fields nixl_agent fills in."""

    def __init__(self, useProgThread=True, useListenThread=False,
                 listenPort=DEFAULT_COMM_PORT, syncMode=0, pthrDelay=0,
                 lthrDelay=100000, captureTelemetry=False):
        self.useProgThread = useProgThread
        self.useListenThread = useListenThread
        self.listenPort = listenPort
        self.syncMode = syncMode
        self.pthrDelay = pthrDelay
        self.lthrDelay = lthrDelay
        self.captureTelemetry = captureTelemetry


# nixl_status_t, as NIXL's bindings return them.
NIXL_IN_PROG, NIXL_SUCCESS = 1, 0
(NIXL_ERR_NOT_POSTED, NIXL_ERR_INVALID_PARAM, NIXL_ERR_BACKEND,
 NIXL_ERR_NOT_FOUND, NIXL_ERR_MISMATCH, NIXL_ERR_NOT_ALLOWED,
 NIXL_ERR_REPOST_ACTIVE, NIXL_ERR_UNKNOWN, NIXL_ERR_NOT_SUPPORTED,
 NIXL_ERR_REMOTE_DISCONNECT, NIXL_ERR_CANCELED,
 NIXL_ERR_NO_TELEMETRY) = range(-1, -13, -1)


# How long an agent without a progress thread is progressed in the
# background after a request with a notification finished (_linger), and
# how often.
_LINGER_S = 1.0
_LINGER_POLL = 0.001
_LINGER_STEPS = 20000


class _BindingAgent(_pdx.Agent):
    """nixl._bindings.nixlAgent: a pdx.Agent (what nixl_agent drives) that
    also has NIXL's low-level binding methods, as NIXL's own tests and
    examples call them: createBackend, registerMem, getLocalMD,
    loadRemoteMD, createXferReq, postXferReq, getXferStatus, getNotifs,
    genNotif, getXferTelemetry, releaseXferReq, deregisterMem,
    invalidateRemoteMD. Handles are ints (NIXL's are pointers); statuses
    are nixl_status_t ints; failures raise the pdx/NIXL error classes, as
    NIXL's bindings raise theirs. The pdx backends are made with the agent
    (by default ucx and cma), so createBackend returns the handle of what
    NIXL's backend name maps to."""

    def __init__(self, *args, telemetry_on=False, **kw):
        super().__init__(*args, **kw)
        self._b_telemetry = telemetry_on
        self._b_prog = bool(kw.get("progress_thread", True))
        self._linger_lock = threading.Lock()
        self._linger_until = 0.0
        self._linger_thread = None
        self._b_regs = {}   # (mem_type, addr, len, dev) -> pdx.MemReg
        self._b_xfers = {}  # handle -> [pdx.Xfer, create args]
        self._b_next = 1
        self._b_backends = {}

    def _linger(self):
        """A request with a notification finished on an agent without a
        progress thread: pdx counts it done once its data moved, while the
        notification (and the UCX wire-up it may wait for) still needs
        this agent progressed. NIXL's callers often stop progressing the
        initiator then (NIXL's own test_agent waits on the target's
        getNotifs only), so the agent is progressed in the background for
        _LINGER_S after the last such completion."""
        if self._b_prog:
            return
        with self._linger_lock:
            self._linger_until = time.monotonic() + _LINGER_S
            if self._linger_thread is not None:
                return
            t = threading.Thread(target=self._linger_run, daemon=True,
                                 name="nixl-linger")
            self._linger_thread = t
        t.start()

    def _linger_run(self):
        # Bounded twice: by the deadline (moved by each completion) and by
        # a count of steps.
        try:
            for _ in range(_LINGER_STEPS):
                with self._linger_lock:
                    if time.monotonic() >= self._linger_until:
                        return
                self.progress()
                time.sleep(_LINGER_POLL)
        except _pdx.Error:
            pass  # closed meanwhile
        finally:
            with self._linger_lock:
                self._linger_thread = None

    def _b_handle(self, reqh):
        x = self._b_xfers.get(int(reqh))
        if x is None:
            raise nixlInvalidParamError("request handle %r is not a live "
                                        "request of agent %s" % (reqh,
                                                                  self.name))
        return x

    def getAvailPlugins(self):
        return list(_PLUGIN_PARAMS)  # POSIX: queries only at this level (no FILE registerMem), unlisted

    def getPluginParams(self, backend):
        if backend.upper() in _QUERY_PLUGINS:
            params, mems = _QUERY_PLUGINS[backend.upper()]
            return dict(params), list(mems)
        if backend.upper() not in _PLUGIN_PARAMS:
            raise nixlNotFoundError("getPluginParams: no plugin %s in pdx"
                                    % backend)
        return dict(_PLUGIN_PARAMS[backend.upper()]), ["DRAM", "VRAM"]

    def createBackend(self, backend, initParams=None):
        if not isinstance(backend, str) or \
                backend.upper() not in _PLUGIN_PARAMS and \
                backend.upper() not in _QUERY_PLUGINS:
            raise nixlNotFoundError("createBackend %r: no such plugin in pdx "
                                    "(plugins: %s)" % (backend, ", ".join(
                                        _PLUGIN_PARAMS)))
        return self._b_backends.setdefault(backend.upper(),
                                           len(self._b_backends) + 1)

    def queryMem(self, descs, backend):
        """NIXL's queryMem: for a query plugin's handle ("POSIX"), each
        FILE descriptor's file info (size, mode, mtime) or None; for the
        pdx backends, {} for a registered region, None otherwise."""
        posix = self._b_backends.get("POSIX")
        if posix is not None and int(backend) == posix:
            return [_query_file(meta) for _a, _n, _d, meta in descs.regions]
        return [{} if (descs.mem_type, a, n, d) in self._b_regs else None
                for a, n, d, _m in descs.regions]

    def registerMem(self, descs, backends=()):
        done = []
        try:
            for addr, length, dev, _meta in descs.regions:
                key = (descs.mem_type, addr, length, dev)
                if descs.mem_type not in ("DRAM", "VRAM"):
                    raise nixlNotSupportedError(
                        "registerMem: %s memory: pdx registers DRAM and "
                        "VRAM only" % descs.mem_type)
                if key in self._b_regs:
                    raise nixlInvalidParamError(
                        "registerMem: 0x%x+%d is already registered"
                        % (addr, length))
                self._b_regs[key] = self.register(
                    (addr, length, descs.mem_type, dev),
                    mem_type=descs.mem_type, device=dev)
                done.append(key)
        except BaseException:
            for key in done:
                self._b_regs.pop(key).deregister()
            raise
        return NIXL_SUCCESS

    def deregisterMem(self, descs, backends=()):
        for addr, length, dev, _meta in descs.regions:
            reg = self._b_regs.pop((descs.mem_type, addr, length, dev), None)
            if reg is None:
                raise nixlNotFoundError("deregisterMem: 0x%x+%d is not "
                                        "registered" % (addr, length))
            reg.deregister()
        return NIXL_SUCCESS

    def getLocalMD(self):
        return self.describe()

    def loadRemoteMD(self, md):
        return self.load_peer(md).encode()

    def invalidateRemoteMD(self, remote_agent):
        self.unload_peer(_name(remote_agent))
        return NIXL_SUCCESS

    def createXferReq(self, operation, local_descs, remote_descs,
                      remote_agent, notif_msg="", backend=()):
        op = "WRITE" if operation == NIXL_WRITE else "READ"
        if operation not in (NIXL_READ, NIXL_WRITE):
            raise nixlInvalidParamError("createXferReq: operation %r"
                                        % (operation,))
        args = (op, list(local_descs), list(remote_descs),
                _name(remote_agent), local_descs.mem_type,
                remote_descs.mem_type)
        x = self._b_make(args, notif_msg)
        h = self._b_next
        self._b_next += 1
        self._b_xfers[h] = [x, args, _notif_bytes(notif_msg, "createXferReq")
                            if notif_msg else b""]
        return h

    def _b_make(self, args, notif_msg):
        op, loc, rem, peer, mt, rmt = args
        return self.create_xfer(op, loc, rem, peer,
                                notif=_notif_bytes(notif_msg, "xfer")
                                if notif_msg else None,
                                mem_type=mt, remote_mem_type=rmt)

    def postXferReq(self, reqh, notif_msg=""):
        ent = self._b_handle(reqh)
        if notif_msg:
            m = _notif_bytes(notif_msg, "postXferReq")
            if m != ent[2]:
                # NIXL: a notification given at post replaces the old one.
                new = self._b_make(ent[1], m)
                ent[0].release()
                ent[0], ent[2] = new, m
        if ent[0].post():
            if ent[2]:
                self._linger()
            return NIXL_SUCCESS
        return NIXL_IN_PROG

    def getXferStatus(self, reqh):
        ent = self._b_handle(reqh)
        if ent[0].check():
            if ent[2]:
                self._linger()
            return NIXL_SUCCESS
        return NIXL_IN_PROG

    def getXferTelemetry(self, reqh):
        x = self._b_handle(reqh)[0]
        if not self._b_telemetry:
            raise nixlNoTelemetryError(
                "getXferTelemetry: agent %s captures no telemetry "
                "(nixlAgentConfig(captureTelemetry=True) or "
                "NIXL_TELEMETRY_ENABLE=y)" % self.name)
        return nixlXferTelemetry(x.telemetry())

    def releaseXferReq(self, reqh):
        self._b_handle(reqh)[0].release()
        del self._b_xfers[int(reqh)]
        return NIXL_SUCCESS

    def getNotifs(self, notif_map, backends=()):
        for peer, msgs in self.get_notifs().items():
            notif_map.setdefault(peer, []).extend(msgs)
        return notif_map

    def genNotif(self, remote_agent, msg, backends=()):
        self.send_notif(_name(remote_agent), msg)
        return NIXL_SUCCESS


def nixlAgent(agent_name, agent_config):
    """nixl._bindings.nixlAgent on pdx: a pdx.Agent with the config's
    progress thread and telemetry, and the pdx backends nixl_agent put in
    the config (pdx makes backends with the agent; nixl_agent makes its
    agent through this name in nixl._bindings, as NIXL does). Made
    directly (NIXL's tests: nixlAgent(name, nixlAgentConfig())), it has
    pdx's default backends and NIXL's low-level methods (_BindingAgent);
    NIXL_TELEMETRY_ENABLE=y turns telemetry on, as in NIXL."""
    direct = not hasattr(agent_config, "pdx_backends")
    env = _env_flag("NIXL_TELEMETRY_ENABLE")
    tele = bool(agent_config.captureTelemetry)
    if direct and env is not None:
        tele = env
    kw = dict(progress_thread=bool(agent_config.useProgThread),
              telemetry=tele,
              store=getattr(agent_config, "pdx_store", None))
    if not direct:
        kw["backends"] = list(agent_config.pdx_backends)
        kw["backend_options"] = getattr(agent_config, "pdx_backend_options",
                                        None) or None
    return _BindingAgent(_name(agent_name), telemetry_on=tele, **kw)


def _binding_ctor():
    b = sys.modules.get("nixl._bindings")
    return getattr(b, "nixlAgent", nixlAgent) if b is not None else nixlAgent
