"""A NIXL-compatible agent on pdx: ``nixl_agent`` and ``nixl_agent_config``
with the calls vLLM's NixlConnector (and SGLang's, Dynamo's) makes on
``nixl._api``: same names, arguments and return conventions.

Use it in place of NIXL without changing the stack's code:

* put ``pdx.nixl.SHIM_PATH`` (``<build>/python/pdx/_nixl_shim``, or the
  same folder of an installed pdx) first on PYTHONPATH: its ``nixl``
  package re-exports this module as ``nixl._api`` and ``nixl._bindings``;
  or
* call ``pdx.nixl.install()`` before the stack imports ``nixl``.

Where pdx behaves differently from NIXL:

* Handles are objects (pdx.PreparedList, pdx.Xfer), not integers; using
  one after release raises ``pdx.Closed`` instead of undefined behaviour.
* "UCX" means pdx's UCX backend plus ``cma`` (same-host memcpy into the
  peer's shared memory) and ``cuda_ipc`` where a GPU is present; the
  backend for each request is chosen by pdx (``backends=`` arguments are
  accepted and ignored). ``query_xfer_backend`` names the pdx backend.
* A notification is sent after every post of a request that carries one:
  reposting a finished request with ``transfer()`` sends it again (as
  NIXL does); ``transfer(h, notif_msg)`` can only repeat the message given
  at creation (pdx fixes it when the request is made).
* check_xfer_state/transfer return "ERR" for any failure (the pdx
  exception text is in ``handle.error``); they raise only for a released
  handle. get_xfer_telemetry never raises for a live handle: without
  ``capture_telemetry=True`` its times are 0 (NIXL raises), while byte and
  descriptor counts and the backend are always there. Times are
  microseconds as in NIXL (startTime since the epoch).
* Exactly repeated registrations of one region are reference-counted
  (NIXL accepts them); partly overlapping ones are refused.
* No listener thread or metadata server: exchange ``get_agent_metadata()``
  bytes out of band (what vLLM's handshake does). Loopback transfers to
  the agent's own name are not supported.
"""

import enum
import os
import sys
import types

import pdx as _pdx

nixl_backend_handle = object
nixl_prepped_dlist_handle = _pdx.PreparedList
nixl_xfer_handle = _pdx.Xfer

# The folder holding a 'nixl' package backed by this module.
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "_nixl_shim")

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
DEFAULT_COMM_PORT = 8888

# NIXL's exception names, as the pdx exceptions that play their part.
nixlInvalidParamError = _pdx.InvalidArgument
nixlNotFoundError = _pdx.NotFound
nixlBackendError = _pdx.BackendError
nixlRemoteDisconnectError = _pdx.RemoteDisconnect
nixlNotSupportedError = _pdx.Unsupported
nixlNotAllowedError = _pdx.PolicyError
nixlMismatchError = _pdx.Mismatch
nixlCancelledError = _pdx.Canceled
nixlNotPostedError = _pdx.Closed

_STATE = {0: "DONE", 1: "PROC"}
_HAVE_TELEMETRY = _pdx.HAVE["xfer_telemetry"]
_NO_TELEMETRY = {"start_time_ns": 0, "post_duration_ns": 0,
                 "xfer_duration_ns": 0, "bytes": 0, "descs": 0,
                 "backend": "", "transport": "", "fallback": False,
                 "fallback_why": ""}


def _backend_modules(names):
    """pdx backends for NIXL backend names (each created once)."""
    out = []
    for n in names:
        key = n.upper()
        if key == "UCX":
            mods = ["ucx", "cma"]
            if _pdx.backend_probe("cuda_ipc")["available"]:
                mods.append("cuda_ipc")
        elif key in ("CMA", "CUDA_IPC"):
            mods = [n.lower()]
        else:
            print("Skipping backend registration", n,
                  "due to the missing plugin.")
            continue
        for m in mods:
            if m not in out:
                out.append(m)
    return out


class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread synchronisation modes (pdx agents are always
    thread-safe: every mode is accepted and behaves as STRICT)."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


class nixl_agent_config:
    """Configuration of a nixl_agent (NIXL's fields; pdx uses
    enable_prog_thread and backends, keeps the rest)."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False,
                 listen_port=DEFAULT_COMM_PORT, capture_telemetry=False,
                 num_threads=0, backends=None, sync_mode=None, **kwargs):
        if sync_mode is not None and \
                not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError("sync_mode must be a nixl_thread_sync_t (got %r)"
                            % type(sync_mode).__name__)
        self.sync_mode = sync_mode
        self.backends = list(backends) if backends is not None else ["UCX"]
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.extra = kwargs


class nixlXferTelemetry:
    """What get_xfer_telemetry returns: NIXL's fields (times in
    microseconds) plus pdx's path (transport, fallback)."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes",
                 "descCount", "backendName", "transport", "fallback",
                 "fallback_why")

    def __init__(self, t):
        self.startTime = t["start_time_ns"] // 1000
        self.postDuration = t["post_duration_ns"] // 1000
        self.xferDuration = t["xfer_duration_ns"] // 1000
        self.totalBytes = t["bytes"]
        self.descCount = t["descs"]
        self.backendName = t["backend"]
        self.transport = t["transport"]
        self.fallback = t["fallback"]
        self.fallback_why = t["fallback_why"]

    def __repr__(self):
        return ("nixlXferTelemetry(descCount=%d, totalBytes=%d, "
                "postDuration=%d, xferDuration=%d, backendName=%r)"
                % (self.descCount, self.totalBytes, self.postDuration,
                   self.xferDuration, self.backendName))


class nixl_reg_dlist:
    """A registration descriptor list (get_reg_descs): regions as
    (addr, len, device, meta) plus the objects they came from."""

    __slots__ = ("mem_type", "regions", "objects", "__weakref__")

    def __init__(self, mem_type, regions, objects):
        self.mem_type = mem_type
        self.regions = regions
        self.objects = objects

    def __len__(self):
        return len(self.regions)

    def __getitem__(self, i):
        return self.regions[i]

    def __repr__(self):
        return "nixl_reg_dlist(%s, %d regions)" % (self.mem_type,
                                                   len(self.regions))


def _is_tensorlike(o):
    return (hasattr(o, "data_ptr") and callable(o.data_ptr)) or \
        hasattr(o, "__cuda_array_interface__")


class nixl_agent:
    """NIXL's Python agent API on a pdx.Agent (see the module docstring
    for the differences)."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is None:
            nixl_conf = nixl_agent_config()
        names = list(nixl_conf.backends)
        if instantiate_all:
            names = ["UCX"]
        self.name = agent_name
        self.notifs = {}
        self.config = nixl_conf
        self._mods = _backend_modules(names)
        self.agent = _pdx.Agent(
            agent_name, progress_thread=bool(nixl_conf.enable_pthread),
            backends=self._mods,
            telemetry=bool(getattr(nixl_conf, "capture_telemetry", False)))
        # NIXL exposes created backends as name -> handle.
        self.backends = {n: n for n in names if n.upper() in
                         ("UCX", "CMA", "CUDA_IPC")}
        self.plugin_list = ["UCX"]
        self.nixl_mems = {"DRAM": "DRAM", "VRAM": "VRAM", "cpu": "DRAM",
                          "cuda": "VRAM"}
        self.nixl_ops = {"WRITE": "WRITE", "READ": "READ"}
        # (mem_type, addr, len, dev) -> [MemReg, refcount]
        self._regs = {}
        self._notif_of = {}

    # -- plugins and backends (informational in pdx) ---------------------
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        return ["DRAM", "VRAM"] if backend.upper() == "UCX" else []

    def get_plugin_params(self, backend):
        return {}

    def get_backend_mem_types(self, backend):
        return self.get_plugin_mem_types(backend)

    def get_backend_params(self, backend):
        return {}

    def create_backend(self, backend, initParams=None):
        """pdx creates its backends with the agent: accepted for UCX."""
        if backend.upper() not in ("UCX", "CMA", "CUDA_IPC"):
            raise _pdx.NotFound("backend %s: no such pdx backend" % backend)
        self.backends.setdefault(backend, backend)

    # -- memory --------------------------------------------------------
    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, nixl_reg_dlist):
            return descs
        if _is_tensorlike(descs):
            descs = [descs]
        regions, objects = [], []
        mt = None
        for d in descs:
            if isinstance(d, (tuple, list)):
                if mem_type is None:
                    raise _pdx.InvalidArgument(
                        "get_reg_descs: give a mem type with tuples")
                addr, length = int(d[0]), int(d[1])
                dev = int(d[2]) if len(d) > 2 else 0
                meta = d[3] if len(d) > 3 else ""
                regions.append((addr, length, dev, meta))
                objects.append(None)
                mt = mem_type
            else:
                addr, length, kind, dev = _pdx.mem_info(d)
                regions.append((addr, length, dev, ""))
                objects.append(d)
                mt = mem_type or kind
        mt = self.nixl_mems.get(mt, mt) if mt is not None else "DRAM"
        return nixl_reg_dlist(mt, regions, objects)

    def register_memory(self, reg_list, mem_type=None, is_sorted=False,
                        backends=()):
        descs = self.get_reg_descs(reg_list, mem_type, is_sorted)
        done = []
        try:
            for (addr, length, dev, _), obj in zip(descs.regions,
                                                   descs.objects):
                key = (descs.mem_type, addr, length, dev)
                ent = self._regs.get(key)
                if ent is not None:
                    ent[1] += 1
                else:
                    src = obj if obj is not None else \
                        (addr, length, descs.mem_type, dev)
                    reg = self.agent.register(src, mem_type=descs.mem_type,
                                              device=dev)
                    self._regs[key] = [reg, 1]
                done.append(key)
        except BaseException:
            for key in done:
                self._drop_reg(key)
            raise
        return descs

    def _drop_reg(self, key):
        ent = self._regs.get(key)
        if ent is None:
            return
        if ent[1] > 1:
            ent[1] -= 1
            return
        ent[0].deregister()
        del self._regs[key]

    def deregister_memory(self, dereg_list, backends=()):
        for (addr, length, dev, _) in dereg_list.regions:
            self._drop_reg((dereg_list.mem_type, addr, length, dev))

    # -- descriptor lists ------------------------------------------------
    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, _pdx.DescList):
            return descs
        if isinstance(descs, nixl_reg_dlist):
            raise _pdx.InvalidArgument(
                "RegList type detected for transfer, please use XferList")
        if _is_tensorlike(descs):
            descs = [descs]
        if isinstance(descs, (list, tuple)) and descs and \
                not isinstance(descs[0], (tuple, list)):
            rows, mt = [], None
            for t in descs:
                addr, length, kind, dev = _pdx.mem_info(t)
                if mt is not None and kind != mt:
                    raise _pdx.InvalidArgument(
                        "get_xfer_descs: tensors on different memory types")
                mt = kind
                rows.append((addr, length, dev))
            return _pdx.DescList(rows, mt)
        if mem_type is None:
            raise _pdx.InvalidArgument(
                "get_xfer_descs: give a mem type with tuples or arrays")
        return _pdx.DescList(descs, self.nixl_mems.get(mem_type, mem_type))

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None,
                        is_sorted=False, backends=()):
        descs = self.get_xfer_descs(xfer_list, mem_type, is_sorted)
        if agent_name in (NIXL_INIT_AGENT, "", None):
            return self.agent.prep_dlist(descs)
        if agent_name == self.name:
            raise _pdx.Unsupported(
                "prep_xfer_dlist: loopback to the agent's own name is not "
                "supported by pdx")
        return self.agent.prep_dlist(descs, agent_name)

    def release_dlist_handle(self, handle):
        handle.release()

    # -- transfers -----------------------------------------------------
    def make_prepped_xfer(self, operation, local_xfer_side, local_indices,
                          remote_xfer_side, remote_indices, notif_msg=b"",
                          backends=(), skip_desc_merge=False):
        notif = notif_msg or None
        if isinstance(notif, str):
            notif = notif.encode()
        h = self.agent.make_xfer(operation, local_xfer_side, local_indices,
                                 remote_xfer_side, remote_indices, notif)
        if notif is not None:
            self._notif_of[h] = notif
        return h

    def initialize_xfer(self, operation, local_descs, remote_descs,
                        remote_agent, notif_msg=b"", backends=()):
        notif = notif_msg or None
        if isinstance(notif, str):
            notif = notif.encode()
        h = self.agent.create_xfer(operation, local_descs, remote_descs,
                                   remote_agent, notif)
        if notif is not None:
            self._notif_of[h] = notif
        return h

    def transfer(self, handle, notif_msg=b""):
        if notif_msg:
            m = notif_msg.encode() if isinstance(notif_msg, str) \
                else bytes(notif_msg)
            if self._notif_of.get(handle) != m:
                raise _pdx.Unsupported(
                    "transfer: pdx fixes a request's notification when it "
                    "is made; give notif_msg to make_prepped_xfer")
        return _STATE.get(handle._post_raw(), "ERR")

    def check_xfer_state(self, handle):
        return _STATE.get(handle._check_raw(), "ERR")

    def get_xfer_telemetry(self, handle):
        if not _HAVE_TELEMETRY:
            # libpdx.so without pdx_xfer_telemetry: zeros rather than an
            # exception in the stack's completion path.
            handle.segments  # still raises for a released handle
            return nixlXferTelemetry(_NO_TELEMETRY)
        return nixlXferTelemetry(handle.telemetry())

    def query_xfer_backend(self, handle):
        return handle.telemetry()["backend"]

    def release_xfer_handle(self, handle):
        self._notif_of.pop(handle, None)
        handle.release()

    def estimate_xfer_cost(self, handle):
        raise _pdx.Unsupported("estimate_xfer_cost: not in pdx")

    # -- notifications -------------------------------------------------
    def get_new_notifs(self, backends=()):
        return self.agent.get_notifs()

    def update_notifs(self, backends=()):
        for peer, msgs in self.agent.get_notifs().items():
            self.notifs.setdefault(peer, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag,
                               backends=(), tag_is_prefix=True):
        self.update_notifs()
        if isinstance(lookup_tag, str):
            lookup_tag = lookup_tag.encode()
        msgs = self.notifs.get(remote_agent_name, [])
        for i, msg in enumerate(msgs):
            if (msg.startswith(lookup_tag) if tag_is_prefix
                    else lookup_tag in msg):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        self.agent.send_notif(remote_agent_name, notif_msg)

    # -- metadata and peers --------------------------------------------
    def get_agent_metadata(self):
        return self.agent.describe()

    def add_remote_agent(self, metadata):
        return self.agent.load_peer(metadata)

    def remove_remote_agent(self, agent):
        self.agent.unload_peer(agent)

    def check_remote_metadata(self, agent, descs=None):
        try:
            self.agent.peer_state(agent)
            return True
        except _pdx.NotFound:
            return False

    def make_connection(self, remote_agent, backends=()):
        """pdx connects when the peer is loaded; checks it is there."""
        self.agent.peer_state(remote_agent)

    def get_partial_agent_metadata(self, descs, inc_conn_info=False,
                                   backends=()):
        raise _pdx.Unsupported("partial metadata: use get_agent_metadata")

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        raise _pdx.Unsupported("no metadata listener in pdx: exchange "
                               "get_agent_metadata() out of band")

    send_partial_agent_metadata = get_partial_agent_metadata
    fetch_remote_metadata = send_local_metadata
    invalidate_local_metadata = send_local_metadata

    # -- pdx extras ----------------------------------------------------
    def close(self):
        """Destroy the agent now (NIXL frees it at garbage collection)."""
        self.agent.close()
        self._regs.clear()
        self._notif_of.clear()


def install():
    """Make ``import nixl``, ``nixl._api`` and ``nixl._bindings`` resolve to
    this module, for stacks written against NIXL."""
    mod = sys.modules[__name__]
    pkg = types.ModuleType("nixl")
    pkg.__path__ = []
    pkg._api = mod
    pkg._bindings = mod
    pkg.nixl_agent = nixl_agent
    pkg.nixl_agent_config = nixl_agent_config
    pkg.nixl_xfer_handle = nixl_xfer_handle
    sys.modules["nixl"] = pkg
    sys.modules["nixl._api"] = mod
    sys.modules["nixl._bindings"] = mod
    return pkg
