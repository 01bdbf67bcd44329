"""pdx.nixl: nixl_agent, NIXL's Python agent on a pdx.Agent (backends,
registration, descriptor lists, transfers, notifications)."""

import os
import threading

try:
    import numpy as np
    _INTS = (int, np.integer)
except ImportError:  # pdx.nixl works without numpy
    np = None
    _INTS = (int,)

import pdx as _pdx
from ._common import (  # noqa: F401
    _QUERY_PLUGINS,
    _query_file,
    DEFAULT_COMM_PORT,
    NIXL_INIT_AGENT,
    _HAVE_TELEMETRY,
    _NO_TELEMETRY,
    _PDX_UCX_OPTS,
    _PLUGIN_PARAMS,
    _backend_modules,
    _env_flag,
    _log,
    _mem,
    _op,
    _name,
    _notif_bytes,
    nixlBackendError,
    nixlInvalidParamError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRepostActiveError,
    nixlXferTelemetry,
    nixl_agent_config,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)
from ._descs import (  # noqa: F401
    _MEMS,
    _is_buffer,
    _is_strided,
    _non_contiguous,
    _nx3,
    _rows_array,
    deserialize_descs,
    nixl_reg_dlist,
    nixl_remote_dlist,
    nixl_xfer_dlist,
    serialize_descs,
    strided_dlist,
)
from ._binding import (  # noqa: F401
    _binding_ctor,
    nixlAgentConfig,
)
from ._exchange import (  # noqa: F401
    _MetadataExchange,
    _Listener,
)
from ._posix import FileDlist, _FileRegs, _PosixXfer, make_file_xfer
from . import _telemetry as _tm


# estimate_xfer_cost's nominal paths: (GB/s, per-request us, per-segment
# us). Orders of magnitude for one host or one 100 Gb/s link, not a
# measurement of this machine: cma (a process_vm_readv/writev copy),
# ucx over tcp, ucx over RDMA (any transport but tcp), cuda_ipc (NVLink or
# PCIe peer copy).
_COST_MODEL = {
    "cma": (8.0, 5.0, 0.2),
    "ucx": (1.0, 30.0, 0.5),
    "ucx_rdma": (12.0, 5.0, 0.2),
    "cuda_ipc": (100.0, 15.0, 1.0),
    # pdx.nixl's POSIX plugin: pread/pwrite on a worker thread, a local
    # disk or page cache.
    "POSIX": (2.0, 20.0, 5.0),
}


class nixl_agent(_MetadataExchange):
    """NIXL's Python agent API on a pdx.Agent (see the module docstring
    for the differences)."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if nixl_conf is not None and instantiate_all:
            instantiate_all = False
        if nixl_conf is None:
            nixl_conf = nixl_agent_config()
        names = list(nixl_conf.backends)
        if instantiate_all:
            names = list(_PLUGIN_PARAMS)
        self.name = _name(agent_name)
        self.notifs = {}
        self.config = nixl_conf
        # NIXL_TELEMETRY_ENABLE=y turns telemetry on, =n off (over the
        # config), as in NIXL.
        env = _env_flag("NIXL_TELEMETRY_ENABLE")
        self._telemetry = env if env is not None else \
            bool(getattr(nixl_conf, "capture_telemetry", False))
        sync = getattr(nixl_conf, "sync_mode", None) or (
            nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
            if getattr(nixl_conf, "enable_listen", False)
            else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        self._binding_config = nixlAgentConfig(
            bool(nixl_conf.enable_pthread),
            bool(getattr(nixl_conf, "enable_listen", False)),
            getattr(nixl_conf, "port", DEFAULT_COMM_PORT), sync.value, 0,
            100000, self._telemetry)
        # NIXL's telemetry file ($NIXL_TELEMETRY_DIR/<name>), or None.
        self._tw = _tm.make_writer(self.name, self._telemetry)
        self._op_of = {}
        self._tw_posted = set()
        self._mods = []
        self._pdx_opts = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        # "POSIX" moves data between host memory and files (pdx.nixl.
        # _posix), as NIXL's plugin, so it is listed.
        self.plugin_list = list(_PLUGIN_PARAMS) + list(_QUERY_PLUGINS)
        self.nixl_mems = dict(_MEMS, FILE="FILE")
        self._files = _FileRegs()
        # Local prepared lists made once the POSIX backend exists -> their
        # nixl_xfer_dlist, for make_prepped_xfer against a FILE list.
        self._local_rows = {}
        self.nixl_ops = {"WRITE": "WRITE", "READ": "READ"}
        # (mem_type, addr, len, dev) -> [MemReg, refcount]
        self._regs = {}
        # Deregistered while lists or requests still used them: released as
        # soon as pdx lets them go (see deregister_memory).
        self._zombies = {}
        self._peers = set()
        self._shadow = None
        self._shadow_regs = {}
        self._peers_internal = set()
        # peer -> None (full metadata) or sorted regions partial metadata
        # named, and their index (built when they change)
        self._allowed = {}
        self._allowed_ix = {}
        # Peers loaded from listener frames: the address each metadata
        # came from (fetched ones too), those nobody asked for, and the
        # names this agent fetched (_exchange.py).
        self._md_from = {}
        self._pushed = set()
        self._fetched = set()
        # A peer's load and what its partial metadata allows change together
        # (the listener thread loads while callers check).
        self._md_lock = threading.RLock()
        self._notif_of = {}
        self.agent = None
        self._listener = None
        # NIXL's etcd mode on pdx's etcd store.
        eps = os.environ.get("NIXL_ETCD_ENDPOINTS", "").strip()
        self._store = None
        # NIXL's metadata keys (pdx.nixl._etcd), made at the first use;
        # the keys this agent sent, for invalidate_local_metadata.
        self._etcd = None
        self._etcd_sent = set()
        if eps:
            self._store = {"type": "etcd",
                           "endpoints": [e for e in eps.split(",") if e],
                           "namespace": os.environ.get(
                               "NIXL_ETCD_NAMESPACE", "/nixl/agents")}
        self._binding_config.pdx_store = self._store
        self._make_agent([])
        for n in names:
            if n.upper() not in _PLUGIN_PARAMS and \
                    n.upper() not in ("CMA", "CUDA_IPC"):
                print("Skipping backend registration", n,
                      "due to the missing plugin.")
                continue
            init = {}
            if getattr(nixl_conf, "num_threads", 0) and n.upper() == "UCX":
                init["num_threads"] = str(nixl_conf.num_threads)
            self.create_backend(n, init)
        self.listen_port = None
        if getattr(nixl_conf, "enable_listen", False):
            self._listener = _Listener(self, getattr(nixl_conf, "port",
                                                     DEFAULT_COMM_PORT))
            self.listen_port = self._listener.port

    def _make_agent(self, mods):
        bopts = {m: dict(self._pdx_opts.get(m, {})) for m in mods}
        self._binding_config.pdx_backends = list(mods)
        self._binding_config.pdx_backend_options = bopts
        agent = _binding_ctor()(self.name, self._binding_config)
        old, self.agent = self.agent, agent
        self._mods = list(mods)
        return old

    # -- plugins and backends ------------------------------------------
    def get_plugin_list(self):
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend):
        if backend.upper() in _QUERY_PLUGINS:
            return list(_QUERY_PLUGINS[backend.upper()][1])
        return ["DRAM", "VRAM"] if backend.upper() in _PLUGIN_PARAMS else []

    def get_plugin_params(self, backend):
        if backend.upper() in _QUERY_PLUGINS:
            return dict(_QUERY_PLUGINS[backend.upper()][0])
        return dict(_PLUGIN_PARAMS.get(backend.upper(), {}))

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(backend, []))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(backend, {}))

    def create_backend(self, backend, initParams=None):
        """Creates the pdx backends NIXL's `backend` maps to ("UCX": ucx,
        cma and cuda_ipc where a GPU is present). pdx adds backends to an
        agent only before it registers memory or loads peers, so a backend
        created later raises nixlNotAllowedError (NIXL stacks create theirs
        right after the agent)."""
        if not isinstance(backend, str):
            raise TypeError("create_backend: a backend name, not %s"
                            % type(backend).__name__)
        params = {str(k): str(v) for k, v in dict(initParams or {}).items()}
        if backend.upper() in _QUERY_PLUGINS:
            # Queries only (query_memory): nothing to make in pdx.
            merged = self.get_plugin_params(backend)
            merged.update(params)
            self.backends[backend] = backend
            self.backend_mems[backend] = self.get_plugin_mem_types(backend)
            self.backend_options[backend] = merged
            return backend
        mods = _backend_modules([backend])
        if not mods:
            raise nixlNotFoundError("create_backend %s: no such plugin in "
                                    "pdx (plugins: %s)"
                                    % (backend, ", ".join(self.plugin_list)))
        new = [m for m in mods if m not in self._mods]
        if new:
            if self._regs or self._zombies or self._peers:
                raise nixlNotAllowedError(
                    "create_backend %s on agent %s: pdx creates backends "
                    "before memory is registered or peers are added "
                    "(%d regions, %d peers)" % (backend, self.name,
                                                len(self._regs) +
                                                len(self._zombies),
                                                len(self._peers)))
            if "ucx" in new:
                self._pdx_opts["ucx"] = {k: params[k] for k in _PDX_UCX_OPTS
                                         if params.get(k)}
            old = self._make_agent(self._mods + new)
            old.close()
        merged = self.get_plugin_params(backend)
        merged.update(params)
        self.backends[backend] = backend
        self.backend_mems[backend] = self.get_plugin_mem_types(backend)
        self.backend_options[backend] = merged
        return backend

    # -- memory --------------------------------------------------------
    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, nixl_reg_dlist):
            return descs
        if isinstance(descs, (nixl_xfer_dlist, _pdx.DescList)):
            _log.error("XferList type detected for registration, please "
                       "use RegList")
            return None
        mt_given = _mem(self.nixl_mems, mem_type) \
            if mem_type is not None else None
        if _nx3(descs):
            if mt_given is None:
                _log.error("get_reg_descs: give a mem type with an N x 3 "
                           "array")
                return None
            rows = _rows_array(descs)
            return nixl_reg_dlist(mt_given, [
                (int(a), int(n), int(d), "") for a, n, d in rows])
        if _is_buffer(descs):
            descs = [descs]
        regions, objects = [], []
        mt = None
        for d in descs:
            if isinstance(d, (tuple, list)):
                if len(d) == 4 and not all(
                        isinstance(v, _INTS) and
                        not isinstance(v, bool) and v >= 0
                        for v in d[:3]):
                    raise nixlInvalidParamError(
                        "get_reg_descs: descriptor %d %r: addr, len and "
                        "device must be non-negative integers"
                        % (len(regions), d))
                if mt_given is None:
                    _log.error("get_reg_descs: give a mem type with tuples")
                    return None
                if len(d) != 4:
                    _log.error("get_reg_descs: (addr, len, device, meta) "
                               "tuples needed for registration, got %r "
                               "(descriptor %d)", d, len(regions))
                    return None
                if not all(isinstance(v, _INTS) and
                           not isinstance(v, bool) and v >= 0
                           for v in d[:3]):
                    raise nixlInvalidParamError(
                        "get_reg_descs: descriptor %d %r: addr, len and "
                        "device must be non-negative integers"
                        % (len(regions), d))
                addr, length, dev, meta = int(d[0]), int(d[1]), int(d[2]), \
                    d[3]
                regions.append((addr, length, dev, meta))
                objects.append(None)
                mt = mt_given
            else:
                if _non_contiguous(d):
                    return None  # as NIXL: no list for such a tensor
                addr, length, kind, dev = _pdx.mem_info(d)
                if mt is not None and mt_given is None and kind != mt:
                    return None  # tensors on different devices (NIXL)
                regions.append((addr, length, dev, ""))
                objects.append(d)
                mt = mt_given or kind
        return nixl_reg_dlist(mt or mt_given or "DRAM", regions, objects)

    def _reap(self):
        """Deregisters what deregister_memory left registered, once no
        list or request uses it any more."""
        for key, reg in list(self._zombies.items()):
            try:
                reg.deregister()
            except _pdx.Busy:
                continue
            except _pdx.Error:
                pass
            del self._zombies[key]
        self._shadow_sync()

    # -- NIXL's telemetry file (pdx.nixl._telemetry) ----------------------
    def _tw_error(self, exc):
        if self._tw is not None and isinstance(exc, _pdx.Error):
            self._tw.emit((_tm.error_event(exc), 1))

    def _tw_done(self, handle):
        """A posted request finished: NIXL's per-request events."""
        if self._tw is None or handle not in self._tw_posted:
            return
        self._tw_posted.discard(handle)
        t = handle.telemetry() if _HAVE_TELEMETRY or \
            isinstance(getattr(handle, "_x", None), _PosixXfer) \
            else dict(_NO_TELEMETRY)
        write = self._op_of.get(handle, "WRITE") == "WRITE"
        self._tw.emit(
            (_tm.XFER_POST_TIME, int(t.get("post_duration_ns", 0)) // 1000),
            (_tm.XFER_TIME, int(t.get("xfer_duration_ns", 0)) // 1000),
            (_tm.TX_BYTES if write else _tm.RX_BYTES, int(t.get("bytes", 0))),
            (_tm.TX_REQUESTS_NUM if write else _tm.RX_REQUESTS_NUM, 1))

    def register_memory(self, reg_list, mem_type=None, is_sorted=False,
                        backends=()):
        try:
            descs = self._register(reg_list, mem_type, is_sorted)
        except BaseException as e:
            self._tw_error(e)
            raise
        if self._tw is not None:
            self._tw.emit((_tm.MEMORY_REGISTERED,
                           sum(r[1] for r in descs.regions)))
        return descs

    def _register(self, reg_list, mem_type=None, is_sorted=False):
        descs = self.get_reg_descs(reg_list, mem_type, is_sorted)
        if descs is None:
            raise nixlInvalidParamError(
                "register_memory: no descriptor list for this input "
                "(a non-contiguous tensor, or tensors on different devices)")
        if descs.mem_type == "FILE":
            if not any(b.upper() == "POSIX" for b in self.backends):
                raise nixlNotFoundError(
                    "register_memory: FILE memory needs the POSIX backend "
                    "(create_backend('POSIX')) on agent %s" % self.name)
            self._files.add(descs.regions)
            return descs
        if not self._mods:
            raise nixlNotFoundError(
                "register_memory: agent %s has no backend; create one with "
                "create_backend('UCX') or nixl_agent_config(backends="
                "['UCX'])" % self.name)
        self._reap()
        done = []
        try:
            for (addr, length, dev, _), obj in zip(descs.regions,
                                                   descs.objects):
                key = (descs.mem_type, addr, length, dev)
                ent = self._regs.get(key)
                if ent is not None:
                    ent[1] += 1
                elif key in self._zombies:
                    self._regs[key] = [self._zombies.pop(key), 1]
                else:
                    src = obj if obj is not None else \
                        (addr, length, descs.mem_type, dev)
                    reg = self.agent.register(src, mem_type=descs.mem_type,
                                              device=dev)
                    self._regs[key] = [reg, 1]
                    self._shadow_sync()
                done.append(key)
        except BaseException:
            for key in done:
                self._drop_reg(key)
            raise
        return descs

    # -- loopback (transfers to the agent's own name) ----------------------
    # pdx does not load an agent as its own peer: a shadow pdx.Agent
    # "<name>.loopback" registers the same regions and is loaded as the
    # peer that the agent's own name stands for; notifications it receives
    # (from this agent) are returned under this agent's name.
    def _loop_name(self):
        return self.name + ".loopback"

    def _loopback(self):
        if self._shadow is None:
            self._shadow = _pdx.Agent(self._loop_name(),
                                      progress_thread=True,
                                      backends=list(self._mods))
            self._shadow_regs = {}
            self._shadow_sync()
        return self._loop_name()

    def _shadow_sync(self):
        """Registers in the shadow what this agent registered (and drops
        what it dropped), then reloads the shadow as a peer."""
        sh = self._shadow
        if sh is None:
            return
        live = set(self._regs) | set(self._zombies)
        changed = False
        for key in list(self._shadow_regs):
            if key not in live:
                try:
                    self._shadow_regs[key].deregister()
                except _pdx.Busy:
                    continue
                del self._shadow_regs[key]
                changed = True
        for key in live:
            if key not in self._shadow_regs:
                mt, addr, length, dev = key
                self._shadow_regs[key] = sh.register((addr, length, mt, dev),
                                                     mem_type=mt, device=dev)
                changed = True
        if changed or self._loop_name() not in self._peers_internal:
            self.agent.load_peer(sh.describe())
            self._peers_internal.add(self._loop_name())

    def _peer(self, name):
        """A peer name, with this agent's own name meaning its loopback."""
        name = _name(name)
        return self._loopback() if name == self.name else name

    def _drop_reg(self, key):
        ent = self._regs.get(key)
        if ent is None:
            return
        if ent[1] > 1:
            ent[1] -= 1
            return
        del self._regs[key]
        try:
            ent[0].deregister()
        except _pdx.Busy:
            # Prepared lists or requests still use it: it stays registered
            # (transfers on it keep working or finish) until they are
            # released, then goes (see _reap).
            self._zombies[key] = ent[0]
        self._shadow_sync()

    def deregister_memory(self, dereg_list, backends=()):
        """As NIXL: accepted in any order with lists and requests still
        alive. A region a prepared list or request of this agent still uses
        stays registered until the last of them is released (their
        transfers complete or fail as they would have); then it is
        deregistered. Everything goes at close()."""
        dereg_list = self.get_reg_descs(dereg_list)
        if self._tw is not None:
            self._tw.emit((_tm.MEMORY_DEREGISTERED,
                           sum(r[1] for r in dereg_list.regions)))
        if dereg_list.mem_type == "FILE":
            self._files.drop(dereg_list.regions)
            return
        for (addr, length, dev, _) in dereg_list.regions:
            self._drop_reg((dereg_list.mem_type, addr, length, dev))

    def query_memory(self, reg_list, backend, mem_type=None):
        """pdx's backends: the registration of each region (None when not
        registered). A query plugin ("POSIX") on FILE descriptors: each
        file's size, mode and mtime, None where it cannot be stat'ed (the
        path is the descriptor's metadata field), as NIXL's."""
        if backend not in self.backends:
            raise ValueError("Backend '%s' not found. Available backends: %s"
                             % (backend, list(self.backends)))
        if backend.upper() in _QUERY_PLUGINS:
            regs = reg_list.regions if isinstance(reg_list, nixl_reg_dlist) \
                else list(reg_list)
            return [_query_file(r[3]) if len(r) == 4 else None for r in regs]
        descs = self.get_reg_descs(reg_list, mem_type)
        out = []
        for (addr, length, dev, _) in descs.regions:
            key = (descs.mem_type, addr, length, dev)
            out.append({"mem_type": descs.mem_type, "device": str(dev)}
                       if key in self._regs else None)
        return out

    # -- descriptor lists ------------------------------------------------
    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, nixl_xfer_dlist):
            return descs
        if isinstance(descs, _pdx.DescList):
            return nixl_xfer_dlist(descs.mem_type, [tuple(d) for d in descs])
        if isinstance(descs, nixl_reg_dlist):
            _log.error("RegList type detected for transfer, please use "
                       "XferList")
            return None
        mt_given = _mem(self.nixl_mems, mem_type) \
            if mem_type is not None else None
        if _nx3(descs) or (isinstance(descs, (list, tuple)) and descs and
                           isinstance(descs[0], (tuple, list))):
            if mt_given is None:
                _log.error("get_xfer_descs: give a mem type with tuples or "
                           "arrays")
                return None
            if not _nx3(descs):
                if any(len(d) != 3 for d in descs):
                    _log.error("get_xfer_descs: (addr, len, device) tuples "
                               "needed for transfer")
                    return None
            return nixl_xfer_dlist(mt_given, descs)
        if _is_buffer(descs):
            descs = [descs]
        rows, mt = [], None
        for t in descs:
            if _non_contiguous(t):
                return None  # as NIXL
            addr, length, kind, dev = _pdx.mem_info(t)
            if mt is not None and kind != mt:
                return None
            mt = kind
            rows.append((addr, length, dev))
        return nixl_xfer_dlist(mt_given or mt or "DRAM", rows)

    def get_remote_descs(self, descs, mem_type=None):
        if isinstance(descs, nixl_remote_dlist):
            return descs
        if mem_type is None:
            raise nixlInvalidParamError("get_remote_descs: give a mem type")
        return nixl_remote_dlist(mem_type, descs)

    def prep_mem_view(self, dlist, *, backends=None):
        raise nixlBackendError("prep_mem_view: needs UCX's GPU device API, "
                               "which pdx does not use "
                               "(HAVE_UCX_GPU_DEVICE_API is False)")

    def release_mem_view(self, mvh):
        raise nixlBackendError("release_mem_view: no memory views in pdx")

    def get_serialized_descs(self, descs):
        return serialize_descs(descs)

    def deserialize_descs(self, serialized_descs):
        return deserialize_descs(serialized_descs)

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None,
                        is_sorted=False, backends=()):
        if _is_strided(xfer_list):
            # NIXL 1.5: N x 5 rows (addr, len, devId, stride, count); the
            # handle is indexed by flattened block index.
            if mem_type is None:
                raise ValueError("Please specify a mem type for strided "
                                 "descriptors")
            descs = strided_dlist(_mem(self.nixl_mems, mem_type), xfer_list)
        else:
            descs = self.get_xfer_descs(xfer_list, mem_type, is_sorted)
        if descs is None:
            raise nixlInvalidParamError(
                "prep_xfer_dlist: no descriptor list for this input")
        local = agent_name in (NIXL_INIT_AGENT, "", None, b"",
                               NIXL_INIT_AGENT.encode())
        if descs.mem_type == "FILE":
            if local or _name(agent_name) != self.name:
                raise nixlNotSupportedError(
                    "prep_xfer_dlist: FILE lists are the agent's own "
                    "(prep_xfer_dlist(%r, ...)); the POSIX plugin moves "
                    "local files" % self.name)
            return FileDlist(self, list(descs))
        if local:
            h = self.agent.prep_dlist(descs.desclist())
            if any(b.upper() == "POSIX" for b in self.backends):
                self._local_rows[h] = descs
            return h
        agent_name = self._peer(agent_name)
        self._check_remote(agent_name, descs)
        return self.agent.prep_dlist(descs.desclist(), agent_name)

    def release_dlist_handle(self, handle):
        self._local_rows.pop(handle, None)
        handle.release()
        if self._zombies:
            self._reap()

    # -- transfers -----------------------------------------------------
    def make_prepped_xfer(self, operation, local_xfer_side, local_indices,
                          remote_xfer_side, remote_indices, notif_msg=b"",
                          backends=(), skip_desc_merge=False):
        return self._tw_made(operation, self._make_prepped, operation,
                             local_xfer_side, local_indices, remote_xfer_side,
                             remote_indices, notif_msg)

    def _tw_made(self, operation, make, *args):
        """make(*args) -> a handle; a failure is a telemetry error event,
        and with telemetry on the handle's operation is kept for its
        events."""
        try:
            h = make(*args)
        except BaseException as e:
            self._tw_error(e)
            raise
        if self._tw is not None:
            self._op_of[h] = operation
        return h

    def _make_prepped(self, operation, local_xfer_side, local_indices,
                      remote_xfer_side, remote_indices, notif_msg):
        _op(self.nixl_ops, operation)  # KeyError for others, as NIXL
        notif = _notif_bytes(notif_msg, "make_prepped_xfer") \
            if notif_msg else None
        if isinstance(remote_xfer_side, FileDlist) or \
                isinstance(local_xfer_side, FileDlist):
            return self._prepped_file_xfer(operation, local_xfer_side,
                                           local_indices, remote_xfer_side,
                                           remote_indices, notif)
        agent = self.agent

        def remake(n):
            return agent.make_xfer(operation, local_xfer_side, local_indices,
                                   remote_xfer_side, remote_indices, n)
        h = nixl_xfer_handle(remake(notif), remake)
        if notif is not None:
            self._notif_of[h] = notif
        return h

    def initialize_xfer(self, operation, local_descs, remote_descs,
                        remote_agent, notif_msg=b"", backends=()):
        return self._tw_made(operation, self._initialize, operation,
                             local_descs, remote_descs, remote_agent,
                             notif_msg)

    def _initialize(self, operation, local_descs, remote_descs,
                    remote_agent, notif_msg):
        _op(self.nixl_ops, operation)
        notif = _notif_bytes(notif_msg, "initialize_xfer") \
            if notif_msg else None
        local = self.get_xfer_descs(local_descs)
        remote = self.get_xfer_descs(remote_descs)
        if local is None or remote is None:
            raise nixlInvalidParamError(
                "initialize_xfer: no descriptor list for the %s side"
                % ("local" if local is None else "remote"))
        if local.mem_type == "FILE" or remote.mem_type == "FILE":
            return self._file_xfer(operation, local, remote, remote_agent,
                                   notif)
        agent, ld, rd = self.agent, local.desclist(), remote.desclist()
        peer = self._peer(remote_agent)
        self._check_remote(peer, remote)

        def remake(n):
            return agent.create_xfer(operation, ld, rd, peer, n)
        h = nixl_xfer_handle(remake(notif), remake)
        if notif is not None:
            self._notif_of[h] = notif
        return h

    def _file_xfer(self, operation, local, remote, remote_agent, notif):
        op = _op(self.nixl_ops, operation)
        x = make_file_xfer(self, op, local, remote, _name(remote_agent),
                           notif)

        def remake(n):
            return make_file_xfer(self, op, local, remote,
                                  _name(remote_agent), n)
        return nixl_xfer_handle(x, remake)

    def _prepped_file_xfer(self, operation, lside, lidx, rside, ridx,
                           notif):
        if isinstance(lside, FileDlist) or \
                not isinstance(rside, FileDlist):
            raise nixlNotSupportedError(
                "make_prepped_xfer: the local side is memory and the remote "
                "side FILE (NIXL's storage transfers)")
        ldescs = self._local_rows.get(lside)
        if ldescs is None:
            raise nixlNotSupportedError(
                "make_prepped_xfer: a FILE request needs a local memory list "
                "prepared (prep_xfer_dlist(NIXL_INIT_AGENT, ...)) after "
                "create_backend('POSIX')")
        rows = []
        for i in lidx:
            i = int(i)
            if not 0 <= i < len(ldescs):
                raise nixlInvalidParamError(
                    "make_prepped_xfer: local index %d of %d descriptors"
                    % (i, len(ldescs)))
            rows.append(ldescs[i])
        local = nixl_xfer_dlist(ldescs.mem_type, rows)
        remote = nixl_xfer_dlist("FILE", rside.pick(ridx, "FILE"))
        return self._file_xfer(operation, local, remote, self.name, notif)

    def _mem_covers(self, mem_type, addr, length, dev):
        """Whether [addr, addr + length) lies in one region this agent
        registered (mem_type, device)."""
        for (mt, a, n, d) in self._regs:
            if mt == mem_type and d == dev and a <= addr and \
                    addr + length <= a + n:
                return True
        return False

    def transfer(self, handle, notif_msg=b""):
        """Posts the request: "DONE" or "PROC"; a failure raises the NIXL
        error class for it (nixlRemoteDisconnectError for a peer that is
        gone, ...), as NIXL's bindings do, with pdx's text."""
        try:
            st = self._transfer(handle, notif_msg)
        except BaseException as e:
            self._tw_error(e)
            raise
        if self._tw is not None:
            self._tw_posted.add(handle)
            if st == "DONE":
                self._tw_done(handle)
        return st

    def _transfer(self, handle, notif_msg):
        if notif_msg:
            m = _notif_bytes(notif_msg, "transfer")
            if self._notif_of.get(handle) != m:
                self._renotify(handle, m)
        if isinstance(handle, nixl_xfer_handle):
            handle._posted = True
        if handle.post():
            self._done_notif(handle)
            return "DONE"
        return "PROC"

    def _done_notif(self, handle):
        # Without a progress thread, the notification of a finished
        # request may still need this agent progressed (_BindingAgent.
        # _linger).
        if self._notif_of.get(handle):
            linger = getattr(self.agent, "_linger", None)
            if linger is not None:
                linger()

    def _renotify(self, handle, msg):
        """Remakes a request that is not in flight with notification
        `msg` (NIXL: a notification given at post replaces the old)."""
        x = handle._x
        if handle._posted and not x.check():
            raise nixlRepostActiveError(
                "transfer: the request is still in flight; repost it once "
                "check_xfer_state says DONE")
        new = handle._remake(msg)
        handle._x = new
        x.release()
        self._notif_of[handle] = msg

    def check_xfer_state(self, handle):
        """"DONE" or "PROC"; a failed request raises its NIXL error class
        (as NIXL's getXferStatus does)."""
        try:
            done = handle.check()
        except BaseException as e:
            if handle in self._tw_posted:
                self._tw_posted.discard(handle)
                self._tw_error(e)
            raise
        if done:
            self._done_notif(handle)
            self._tw_done(handle)
            return "DONE"
        return "PROC"

    def get_xfer_telemetry(self, handle):
        if not self._telemetry:
            handle.segments  # still raises for a released handle
            raise nixlNoTelemetryError(
                "get_xfer_telemetry: agent %s captures no telemetry "
                "(nixl_agent_config(capture_telemetry=True) or "
                "NIXL_TELEMETRY_ENABLE=y)" % self.name)
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
        self._op_of.pop(handle, None)
        self._tw_posted.discard(handle)
        handle.release()
        if self._zombies:
            self._reap()

    def estimate_xfer_cost(self, handle):
        """(duration, error margin, method) as NIXL: microseconds and
        "ANALYTICAL_BACKEND". pdx's model (docs/NIXL.md): the request's
        bytes over the bandwidth of the path pdx chose for it plus a
        per-request and per-segment cost (_COST_MODEL; the ucx backend
        before the request ran: its nominal tcp figures). Once the
        request has run with telemetry captured, its measured transfer
        time is the estimate (margin 10 %); else the nominal one
        (margin 50 %)."""
        t = handle.telemetry() if _HAVE_TELEMETRY else dict(_NO_TELEMETRY)
        nbytes, nseg = int(t.get("bytes", 0)), int(handle.segments)
        measured = int(t.get("xfer_duration_ns", 0))
        if self._telemetry and measured > 0 and int(t.get("posts", 0)) > 0:
            us = max(1, -(-measured // 1000))
            return us, max(1, us // 10), "ANALYTICAL_BACKEND"
        path = t.get("backend") or "ucx"
        if path == "ucx" and t.get("transport", "") not in ("", "tcp"):
            path = "ucx_rdma"
        gbps, lat_us, seg_us = _COST_MODEL.get(path, _COST_MODEL["ucx"])
        us = lat_us + seg_us * nseg + nbytes / (gbps * 1e3)
        us = max(1, int(round(us)))
        return us, max(1, us // 2), "ANALYTICAL_BACKEND"

    # -- notifications -------------------------------------------------
    def get_new_notifs(self, backends=()):
        got = self.agent.get_notifs()
        if self._shadow is not None:
            # Loopback notifications: sent by this agent to itself.
            for peer, msgs in self._shadow.get_notifs().items():
                got.setdefault(peer, []).extend(msgs)
        return got

    def update_notifs(self, backends=()):
        for peer, msgs in self.get_new_notifs().items():
            self.notifs.setdefault(peer, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag,
                               backends=(), tag_is_prefix=True):
        self.update_notifs()
        if isinstance(lookup_tag, str):
            lookup_tag = lookup_tag.encode()
        msgs = self.notifs.get(_name(remote_agent_name), [])
        for i, msg in enumerate(msgs):
            if (msg.startswith(lookup_tag) if tag_is_prefix
                    else lookup_tag in msg):
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        """bytes, or str (sent UTF-8 encoded, as NIXL takes either)."""
        self.agent.send_notif(_name(remote_agent_name),
                              _notif_bytes(notif_msg, "send_notif"))

    # -- pdx extras ----------------------------------------------------
    def close(self):
        """Destroy the agent now (NIXL frees it at garbage collection):
        every registration, list and request of it goes too."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._etcd_close()
        self._files.close()
        self._local_rows.clear()
        if self._tw is not None:
            self._tw.close()
        self.agent.close()
        if self._shadow is not None:
            self._shadow.close()
            self._shadow = None
            self._shadow_regs = {}
        self._regs.clear()
        self._zombies.clear()
        self._peers.clear()
        self._notif_of.clear()
