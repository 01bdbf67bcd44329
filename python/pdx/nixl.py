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

* Handles are objects (pdx.PreparedList, nixl_xfer_handle wrapping a
  pdx.Xfer), not integers; using one after release raises ``pdx.Closed``
  instead of undefined behaviour.
* "UCX" means pdx's UCX backend plus ``cma`` (same-host memcpy into the
  peer's shared memory) and ``cuda_ipc`` where a GPU is present; the
  backend for each request is chosen by pdx (``backends=`` arguments are
  accepted and ignored). ``query_xfer_backend`` names the pdx backend.
  ``create_backend`` creates them; pdx adds backends only before memory
  is registered or peers are added (nixlNotAllowedError after). NIXL's UCX
  parameters are accepted and reported by get_backend_params; only pdx's
  own (tls, max_chunk) change anything.
* A notification is sent after every post of a request that carries one:
  reposting a finished request with ``transfer()`` sends it again (as
  NIXL does); ``transfer(h, notif_msg)`` with another message remakes the
  finished request with it (pdx fixes a request's notification when it is
  made); a request still in flight raises nixlRepostActiveError.
* check_xfer_state/transfer return "DONE" or "PROC"; a failure raises the
  NIXL class for it, as NIXL's bindings do (nixlRemoteDisconnectError for
  a dead peer, ...; they are the pdx exceptions, with pdx's text).
  get_xfer_telemetry raises nixlNoTelemetryError unless the agent
  captures telemetry (``capture_telemetry=True`` or NIXL_TELEMETRY_ENABLE=y;
  =n turns it off), as NIXL. Times are microseconds as in NIXL.
* Malformed descriptor input to get_xfer_descs/get_reg_descs gives None
  (logged on the 'nixl' logger) and an unknown mem type or operation a
  KeyError, as NIXL; the calls taking such a None raise
  nixlInvalidParamError.
* Exactly repeated registrations of one region are reference-counted
  (NIXL accepts them); partly overlapping ones are refused.
* deregister_memory is accepted in any order: a region that prepared
  lists or requests (finished or not) still use stays registered until
  the last of them is released, then goes; close() frees everything.
* get_serialized_descs/deserialize_descs use pdx's own byte format, not
  pickle: bytes from a peer are parsed and checked, never executed.
* add_remote_agent returns the name as bytes (as NIXL); every call takes
  names as str or bytes. check_remote_metadata is False once the peer is
  unknown, removed or known dead.
* The listener thread (enable_listen_thread, listen_port; 0 picks a free
  port, in .listen_port) speaks pdx's own framing, so both ends must be
  pdx.nixl; it listens on all addresses as NIXL, or on
  $PDX_NIXL_LISTEN_ADDR. fetch_remote_metadata loads in the background
  (poll check_remote_metadata). Partial metadata carries the full blob
  plus the regions it names; transfers may use only named regions
  (nixlNotFoundError otherwise), as NIXL.
  With NIXL_ETCD_ENDPOINTS (and NIXL_ETCD_NAMESPACE, default
  /nixl/agents) the agent uses pdx's etcd store: send_local_metadata()
  publishes, fetch_remote_metadata(name) fetches by name; pdx's own key
  layout under that namespace, not NIXL's; invalidate without an address
  is not supported (the key goes with the agent's lease at close()).
* Loopback (the agent's own name as the remote side) goes through a shadow
  pdx.Agent "<name>.loopback" that registers the same regions (made at
  the first loopback use); its notifications come back under the agent's
  own name. estimate_xfer_cost and prep_mem_view are not supported.

docs/NIXL.md has the table of NIXL calls and their status per stack.
"""

import bisect
import enum
import logging
import os
import socket
import struct
import sys
import threading

import numpy as np

import pdx as _pdx

nixl_backend_handle = object
nixl_prepped_dlist_handle = _pdx.PreparedList


class nixl_xfer_handle:
    """A transfer handle: the pdx.Xfer it wraps (its attributes and
    methods: status, error, check, telemetry, ...) plus how to make it
    again, so that transfer(h, new_notif) can repost a finished request
    with another notification as NIXL does (pdx fixes a request's
    notification when it is made: the request is remade)."""

    __slots__ = ("_x", "_remake", "_posted", "__weakref__")

    def __init__(self, xfer, remake):
        self._x = xfer
        self._remake = remake
        self._posted = False

    def __getattr__(self, name):
        return getattr(self._x, name)

    def release(self):
        self._x.release()

    def __repr__(self):
        return "nixl_xfer_handle(%r)" % (self._x,)

# The folder holding a 'nixl' package backed by this module.
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "_nixl_shim")

NIXL_INIT_AGENT = "NIXL_INIT_AGENT"
DEFAULT_COMM_PORT = 8888

# NIXL's exception names, as the pdx exceptions that play their part (a
# pdx error raised by a call is an instance of the NIXL class NIXL raises
# for that status; the text is pdx's).
nixlInvalidParamError = _pdx.InvalidArgument
nixlNotFoundError = _pdx.NotFound
nixlBackendError = _pdx.BackendError
nixlRemoteDisconnectError = _pdx.RemoteDisconnect
nixlNotSupportedError = _pdx.Unsupported
nixlNotAllowedError = _pdx.PolicyError
nixlMismatchError = _pdx.Mismatch
nixlCancelledError = _pdx.Canceled
nixlNotPostedError = _pdx.Closed


class nixlRepostActiveError(_pdx.Error):
    """NIXL's error for posting a request still in flight."""


class nixlUnknownError(_pdx.Error):
    """NIXL's error for a status it does not know."""


class nixlNoTelemetryError(_pdx.Error):
    """get_xfer_telemetry on an agent made without telemetry."""


# NIXL's memory segment names (nixl._bindings constants).
DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG = 0, 1, 2, 3, 4
_SEG_NAME = {DRAM_SEG: "DRAM", VRAM_SEG: "VRAM", BLK_SEG: "BLK",
             OBJ_SEG: "OBJ", FILE_SEG: "FILE"}
NIXL_READ, NIXL_WRITE = 0, 1
HAVE_UCX_GPU_DEVICE_API = False

# The NIXL names pdx backs, and the NIXL parameters each accepts (defaults
# as strings, as get_plugin_params returns them). pdx maps none of NIXL's
# UCX tuning knobs to an equivalent (pdx sizes its own workers and picks
# devices through UCX_NET_DEVICES); they are accepted and reported by
# get_backend_params. pdx's own UCX options (tls, max_chunk) are passed
# through to the ucx backend.
_PLUGIN_PARAMS = {
    "UCX": {"num_threads": "0", "num_workers": "1", "device_list": "all",
            "error_handling_mode": "peer", "ucx_error_handling_mode": "peer",
            "split_batch_size": "0", "tls": "", "max_chunk": ""},
}
_PDX_UCX_OPTS = ("tls", "max_chunk")


def _name(n):
    """An agent name as str: NIXL takes str or bytes (add_remote_agent
    returns bytes)."""
    if isinstance(n, (bytes, bytearray, memoryview)):
        return bytes(n).decode()
    if isinstance(n, str):
        return n
    raise TypeError("agent name: str or bytes, not %s" % type(n).__name__)


def _notif_bytes(msg, what):
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise TypeError("%s: the message must be bytes or str, not %s"
                    % (what, type(msg).__name__))


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
        # Microseconds, as NIXL's; a duration under 1 us that did take
        # time reads 1 (rounded up), not 0.
        self.startTime = t["start_time_ns"] // 1000
        self.postDuration = -(-t["post_duration_ns"] // 1000)
        self.xferDuration = -(-t["xfer_duration_ns"] // 1000)
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


_SER_MAGIC = b"PDXNIXLD"
_SER_VERSION = 1
_SER_XFER, _SER_REG = 1, 2
_SER_MT = {"DRAM": 0, "VRAM": 1}
_SER_MT_NAME = {v: k for k, v in _SER_MT.items()}
_SER_MAX_DESCS = 1 << 26
_SER_HDR = struct.Struct("<8sHBBQ")


def _rows_array(rows):
    """An N x 3 C-contiguous uint64 array from tuples or an array."""
    a = np.ascontiguousarray(np.asarray(rows, dtype=np.uint64))
    if a.size == 0:
        return np.zeros((0, 3), np.uint64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise _pdx.InvalidArgument(
            "descriptors: (addr, len, device) rows expected, got shape %r"
            % (a.shape,))
    return a


class nixl_xfer_dlist:
    """A transfer descriptor list (get_xfer_descs; NIXL's nixlXferDList):
    rows (addr, len, device) of one memory type, held as an N x 3 uint64
    array and handed to pdx as a pdx.DescList."""

    __slots__ = ("mem_type", "_rows", "_dl", "__weakref__")

    def __init__(self, mem_type, rows=()):
        if isinstance(mem_type, int):
            mem_type = _SEG_NAME.get(mem_type, mem_type)
        self.mem_type = _MEMS.get(mem_type, mem_type)
        self._rows = _rows_array(rows)
        self._dl = None

    def desclist(self):
        """The pdx.DescList of these rows (made once)."""
        if self._dl is None:
            self._dl = _pdx.DescList(self._rows, self.mem_type)
        return self._dl

    def descCount(self):
        return int(self._rows.shape[0])

    def isEmpty(self):
        return self._rows.shape[0] == 0

    def getType(self):
        """NIXL's segment constant (DRAM_SEG, VRAM_SEG)."""
        return _SEG_OF[self.mem_type]

    def addDesc(self, desc):
        self._rows = np.vstack([self._rows, _rows_array([tuple(desc[:3])])])
        self._dl = None

    def remDesc(self, index):
        self._rows = np.delete(self._rows, int(index), axis=0)
        self._dl = None

    def clear(self):
        self._rows = np.zeros((0, 3), np.uint64)
        self._dl = None

    def print(self):
        print(repr(self), list(self))

    def __getstate__(self):
        return {"mem_type": self.mem_type, "rows": self._rows}

    def __setstate__(self, st):
        self.mem_type = st["mem_type"]
        self._rows = _rows_array(st["rows"])
        self._dl = None

    def __len__(self):
        return int(self._rows.shape[0])

    def __getitem__(self, i):
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]))

    def __iter__(self):
        for r in self._rows:
            yield (int(r[0]), int(r[1]), int(r[2]))

    def __eq__(self, other):
        return (isinstance(other, nixl_xfer_dlist) and
                self.mem_type == other.mem_type and
                np.array_equal(self._rows, other._rows))

    __hash__ = object.__hash__

    def __repr__(self):
        return "nixl_xfer_dlist(%s, %d descs)" % (self.mem_type, len(self))


class nixl_reg_dlist:
    """A registration descriptor list (get_reg_descs; NIXL's nixlRegDList):
    regions as (addr, len, device, meta) plus the objects they came from
    (None for regions given by address)."""

    __slots__ = ("mem_type", "regions", "objects", "__weakref__")

    def __init__(self, mem_type, regions=(), objects=None):
        if isinstance(mem_type, int):
            mem_type = _SEG_NAME.get(mem_type, mem_type)
        self.mem_type = _MEMS.get(mem_type, mem_type)
        self.regions = list(regions)
        self.objects = list(objects) if objects is not None else \
            [None] * len(self.regions)

    def descCount(self):
        return len(self.regions)

    def isEmpty(self):
        return not self.regions

    def getType(self):
        """NIXL's segment constant (DRAM_SEG, VRAM_SEG)."""
        return _SEG_OF[self.mem_type]

    def addDesc(self, desc):
        a, n, d = (int(v) for v in desc[:3])
        self.regions.append((a, n, d, desc[3] if len(desc) > 3 else ""))
        self.objects.append(None)

    def remDesc(self, index):
        del self.regions[int(index)]
        del self.objects[int(index)]

    def clear(self):
        self.regions = []
        self.objects = []

    def print(self):
        print(repr(self), self.regions)

    def __getstate__(self):
        return {"mem_type": self.mem_type, "regions": list(self.regions)}

    def __setstate__(self, st):
        self.mem_type = st["mem_type"]
        self.regions = list(st["regions"])
        self.objects = [None] * len(self.regions)

    def trim(self):
        """The transfer list of these regions (meta dropped), as NIXL's
        nixlRegDList.trim()."""
        return nixl_xfer_dlist(self.mem_type,
                               [tuple(r[:3]) for r in self.regions])

    def __len__(self):
        return len(self.regions)

    def __getitem__(self, i):
        return self.regions[i]

    def __eq__(self, other):
        return (isinstance(other, nixl_reg_dlist) and
                self.mem_type == other.mem_type and
                self.regions == other.regions)

    __hash__ = object.__hash__

    def __repr__(self):
        return "nixl_reg_dlist(%s, %d regions)" % (self.mem_type,
                                                   len(self.regions))


class nixl_remote_dlist:
    """get_remote_descs: rows (addr, len, device, agent) for prep_mem_view,
    which needs UCX's GPU device API (not in pdx)."""

    __slots__ = ("mem_type", "rows")

    def __init__(self, mem_type, rows):
        self.mem_type = _MEMS.get(mem_type, mem_type)
        self.rows = [(int(a), int(n), int(d), _name(g)) for a, n, d, g in rows]

    def descCount(self):
        return len(self.rows)

    def __len__(self):
        return len(self.rows)


# nixl._bindings names for the list classes.
nixlXferDList = nixl_xfer_dlist
nixlRegDList = nixl_reg_dlist
nixlRemoteDList = nixl_remote_dlist

_MEMS = {"DRAM": "DRAM", "VRAM": "VRAM", "cpu": "DRAM", "cuda": "VRAM"}
_SEG_OF = {"DRAM": DRAM_SEG, "VRAM": VRAM_SEG}


def serialize_descs(descs):
    """Bytes for a nixl_xfer_dlist or nixl_reg_dlist (pdx's own format:
    header, rows as little-endian uint64, metas; no pickle, so bytes from a
    peer can be rebuilt safely with deserialize_descs)."""
    if isinstance(descs, _pdx.DescList):
        descs = nixl_xfer_dlist(descs.mem_type, [tuple(d) for d in descs])
    if isinstance(descs, nixl_xfer_dlist):
        rows = descs._rows.astype("<u8", copy=False)
        return _SER_HDR.pack(_SER_MAGIC, _SER_VERSION, _SER_XFER,
                             _SER_MT[descs.mem_type], len(descs)) + \
            rows.tobytes()
    if isinstance(descs, nixl_reg_dlist):
        rows = np.array([r[:3] for r in descs.regions] or
                        np.zeros((0, 3)), dtype="<u8")
        metas = []
        for r in descs.regions:
            m = r[3] if len(r) > 3 else ""
            m = m.encode() if isinstance(m, str) else bytes(m)
            metas.append(struct.pack("<I", len(m)) + m)
        return _SER_HDR.pack(_SER_MAGIC, _SER_VERSION, _SER_REG,
                             _SER_MT[descs.mem_type], len(descs)) + \
            rows.tobytes() + b"".join(metas)
    raise TypeError("get_serialized_descs: a descriptor list from "
                    "get_xfer_descs or get_reg_descs, not %s"
                    % type(descs).__name__)


def deserialize_descs(data):
    """The list serialize_descs made; malformed bytes raise
    nixlInvalidParamError naming what is wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("deserialize_descs: bytes, not %s"
                        % type(data).__name__)
    data = bytes(data)
    bad = _pdx.InvalidArgument
    if len(data) < _SER_HDR.size:
        raise bad("deserialize_descs: %d bytes, shorter than the %d-byte "
                  "header" % (len(data), _SER_HDR.size))
    magic, ver, kind, mt, n = _SER_HDR.unpack_from(data)
    if magic != _SER_MAGIC:
        raise bad("deserialize_descs: not a pdx descriptor list (magic %r)"
                  % magic)
    if ver != _SER_VERSION:
        raise bad("deserialize_descs: version %d, this pdx reads %d"
                  % (ver, _SER_VERSION))
    if mt not in _SER_MT_NAME:
        raise bad("deserialize_descs: memory type %d unknown" % mt)
    if kind not in (_SER_XFER, _SER_REG):
        raise bad("deserialize_descs: list kind %d unknown" % kind)
    if n > _SER_MAX_DESCS:
        raise bad("deserialize_descs: %d descriptors, at most %d"
                  % (n, _SER_MAX_DESCS))
    off = _SER_HDR.size
    end = off + 24 * n
    if len(data) < end:
        raise bad("deserialize_descs: %d descriptors need %d bytes, got %d"
                  % (n, end, len(data)))
    rows = np.frombuffer(data, "<u8", 3 * n, off).reshape(n, 3)
    if kind == _SER_XFER:
        if len(data) != end:
            raise bad("deserialize_descs: %d bytes after the descriptors"
                      % (len(data) - end))
        return nixl_xfer_dlist(_SER_MT_NAME[mt], rows.astype(np.uint64))
    regions = []
    off = end
    for i in range(n):
        if len(data) < off + 4:
            raise bad("deserialize_descs: region %d: meta length truncated"
                      % i)
        (ml,) = struct.unpack_from("<I", data, off)
        off += 4
        if len(data) < off + ml:
            raise bad("deserialize_descs: region %d: meta of %d bytes "
                      "truncated" % (i, ml))
        meta = data[off:off + ml]
        off += ml
        try:
            meta = meta.decode()
        except UnicodeDecodeError:
            pass
        r = rows[i]
        regions.append((int(r[0]), int(r[1]), int(r[2]), meta))
    if off != len(data):
        raise bad("deserialize_descs: %d bytes after the regions"
                  % (len(data) - off))
    return nixl_reg_dlist(_SER_MT_NAME[mt], regions)


def _is_tensorlike(o):
    return (hasattr(o, "data_ptr") and callable(o.data_ptr)) or \
        hasattr(o, "__cuda_array_interface__")


def _non_contiguous(o):
    f = getattr(o, "is_contiguous", None)
    if callable(f):
        return not f()
    if isinstance(o, np.ndarray):
        return not (o.flags.c_contiguous or o.flags.f_contiguous)
    return False


def _is_buffer(o):
    """One object that is one region: a tensor, an array that is not an
    N x 3 descriptor table, or any buffer-protocol object."""
    if _is_tensorlike(o):
        return True
    if isinstance(o, (tuple, list, nixl_reg_dlist, nixl_xfer_dlist)):
        return False
    try:
        memoryview(o)
        return True
    except TypeError:
        return False


def _nx3(o):
    return isinstance(o, np.ndarray) and o.ndim == 2 and o.shape[1] == 3


_log = logging.getLogger("nixl")


def _env_flag(name):
    """True/False for a set yes/no variable, None when unset or other."""
    v = os.environ.get(name, "").strip().lower()
    if v in ("y", "yes", "1", "true", "on"):
        return True
    if v in ("n", "no", "0", "false", "off"):
        return False
    return None


def _mem(mems, mem_type):
    """NIXL's mem type lookup: an unknown name is a KeyError, as in NIXL."""
    if mem_type not in mems:
        raise KeyError("mem type %r: one of %s" % (mem_type,
                                                  ", ".join(mems)))
    return mems[mem_type]


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
        self._b_regs = {}   # (mem_type, addr, len, dev) -> pdx.MemReg
        self._b_xfers = {}  # handle -> [pdx.Xfer, create args]
        self._b_next = 1
        self._b_backends = {}

    def _b_handle(self, reqh):
        x = self._b_xfers.get(int(reqh))
        if x is None:
            raise nixlInvalidParamError("request handle %r is not a live "
                                        "request of agent %s" % (reqh,
                                                                  self.name))
        return x

    def getAvailPlugins(self):
        return list(_PLUGIN_PARAMS)

    def getPluginParams(self, backend):
        if backend.upper() not in _PLUGIN_PARAMS:
            raise nixlNotFoundError("getPluginParams: no plugin %s in pdx"
                                    % backend)
        return dict(_PLUGIN_PARAMS[backend.upper()]), ["DRAM", "VRAM"]

    def createBackend(self, backend, initParams=None):
        if not isinstance(backend, str) or \
                backend.upper() not in _PLUGIN_PARAMS:
            raise nixlNotFoundError("createBackend %r: no such plugin in pdx "
                                    "(plugins: %s)" % (backend, ", ".join(
                                        _PLUGIN_PARAMS)))
        return self._b_backends.setdefault(backend.upper(),
                                           len(self._b_backends) + 1)

    def registerMem(self, descs, backends=()):
        done = []
        try:
            for addr, length, dev, _meta in descs.regions:
                key = (descs.mem_type, addr, length, dev)
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
        return NIXL_SUCCESS if ent[0].post() else NIXL_IN_PROG

    def getXferStatus(self, reqh):
        return NIXL_SUCCESS if self._b_handle(reqh)[0].check() \
            else NIXL_IN_PROG

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


# -- NIXL's metadata exchange: the listener thread ---------------------------
# pdx's wire format between pdx.nixl agents (not NIXL's): a frame is
# b"PDXL", a kind byte, a little-endian u32 length and that many bytes.
# MD: a peer's metadata to load; FETCH: "send me yours" (the reply is an MD
# frame, or ERR with the reason); INVAL: forget the sender's metadata (its
# name is the payload). A connection carries one request. Everything read
# is bounded (size, time) and a blob is loaded through pdx's checks.
_LF_MAGIC = b"PDXL"
_LF_HDR = struct.Struct("<4sBI")
_LF_MD, _LF_FETCH, _LF_INVAL, _LF_ERR = 1, 2, 3, 4
_LF_MAX = 64 << 20
# Partial metadata (get_partial_agent_metadata): b"PDXPMD1\0", a u32 count,
# that many (addr, len, device) u64 rows, then the agent's full blob. The
# receiver loads the blob but lets transfers use only the regions some
# partial metadata named, as NIXL (a full metadata lifts that).
_PMD_MAGIC = b"PDXPMD1\0"
_PMD_MAX_ROWS = 1 << 24
_LF_TIMEOUT = 5.0


def _lf_send(sock, kind, payload):
    sock.sendall(_LF_HDR.pack(_LF_MAGIC, kind, len(payload)) + payload)


def _lf_recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed after %d of %d bytes"
                                  % (len(out), n))
        out += chunk
    return bytes(out)


def _lf_recv(sock):
    magic, kind, n = _LF_HDR.unpack(_lf_recv_exact(sock, _LF_HDR.size))
    if magic != _LF_MAGIC:
        raise ValueError("not a pdx.nixl metadata frame (magic %r)" % magic)
    if kind not in (_LF_MD, _LF_FETCH, _LF_INVAL, _LF_ERR):
        raise ValueError("frame kind %d unknown" % kind)
    if n > _LF_MAX:
        raise ValueError("frame of %d bytes, at most %d" % (n, _LF_MAX))
    return kind, _lf_recv_exact(sock, n)


def _lf_connect(ip, port):
    return socket.create_connection((ip, int(port)), timeout=_LF_TIMEOUT)


class _Listener:
    """The listener thread of a nixl_agent (enable_listen_thread): serves
    MD, FETCH and INVAL frames on (PDX_NIXL_LISTEN_ADDR or all addresses,
    as NIXL, listen_port; 0 picks a free port, see .port)."""

    def __init__(self, owner, port):
        self.owner = owner
        addr = os.environ.get("PDX_NIXL_LISTEN_ADDR", "")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((addr, int(port)))
            self.sock.listen(16)
        except OSError as e:
            self.sock.close()
            raise nixlBackendError("listener of %s on port %s: %s"
                                   % (owner.name, port, e)) from None
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="nixl-listen-" + owner.name)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                conn, who = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            with conn:
                conn.settimeout(_LF_TIMEOUT)
                try:
                    self._serve(conn)
                except Exception as e:  # a bad peer never stops us
                    _log.error("agent %s: metadata from %s:%d refused: %s",
                               self.owner.name, who[0], who[1], e)

    def _serve(self, conn):
        kind, payload = _lf_recv(conn)
        agent = self.owner
        if kind == _LF_MD:
            agent._load_md(payload)
        elif kind == _LF_FETCH:
            try:
                md = agent.get_agent_metadata()
            except Exception as e:
                _lf_send(conn, _LF_ERR, str(e).encode())
                return
            _lf_send(conn, _LF_MD, md)
        elif kind == _LF_INVAL:
            name = payload.decode()
            if name in agent._peers:
                agent.remove_remote_agent(name)
        else:
            raise ValueError("unexpected frame kind %d" % kind)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


class nixl_agent:
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
        self._mods = []
        self._pdx_opts = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self.plugin_list = list(_PLUGIN_PARAMS)
        self.nixl_mems = dict(_MEMS)
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
        # named
        self._allowed = {}
        # A peer's load and what its partial metadata allows change together
        # (the listener thread loads while callers check).
        self._md_lock = threading.RLock()
        self._notif_of = {}
        self.agent = None
        self._listener = None
        # NIXL's etcd mode on pdx's etcd store.
        eps = os.environ.get("NIXL_ETCD_ENDPOINTS", "").strip()
        self._store = None
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
        return ["DRAM", "VRAM"] if backend.upper() in _PLUGIN_PARAMS else []

    def get_plugin_params(self, backend):
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
                if mt_given is None:
                    _log.error("get_reg_descs: give a mem type with tuples")
                    return None
                if len(d) != 4:
                    _log.error("get_reg_descs: (addr, len, device, meta) "
                               "tuples needed for registration, got %r",
                               d)
                    return None
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

    def register_memory(self, reg_list, mem_type=None, is_sorted=False,
                        backends=()):
        descs = self.get_reg_descs(reg_list, mem_type, is_sorted)
        if descs is None:
            raise nixlInvalidParamError(
                "register_memory: no descriptor list for this input "
                "(a non-contiguous tensor, or tensors on different devices)")
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
        for (addr, length, dev, _) in dereg_list.regions:
            self._drop_reg((dereg_list.mem_type, addr, length, dev))

    def query_memory(self, reg_list, backend, mem_type=None):
        if backend not in self.backends:
            raise ValueError("Backend '%s' not found. Available backends: %s"
                             % (backend, list(self.backends)))
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
        descs = self.get_xfer_descs(xfer_list, mem_type, is_sorted)
        if descs is None:
            raise nixlInvalidParamError(
                "prep_xfer_dlist: no descriptor list for this input")
        if agent_name in (NIXL_INIT_AGENT, "", None, b"",
                          NIXL_INIT_AGENT.encode()):
            return self.agent.prep_dlist(descs.desclist())
        agent_name = self._peer(agent_name)
        self._check_remote(agent_name, descs)
        return self.agent.prep_dlist(descs.desclist(), agent_name)

    def release_dlist_handle(self, handle):
        handle.release()
        if self._zombies:
            self._reap()

    # -- transfers -----------------------------------------------------
    def make_prepped_xfer(self, operation, local_xfer_side, local_indices,
                          remote_xfer_side, remote_indices, notif_msg=b"",
                          backends=(), skip_desc_merge=False):
        _mem(self.nixl_ops, operation)  # KeyError for others, as NIXL
        notif = _notif_bytes(notif_msg, "make_prepped_xfer") \
            if notif_msg else None
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
        _mem(self.nixl_ops, operation)
        notif = _notif_bytes(notif_msg, "initialize_xfer") \
            if notif_msg else None
        local = self.get_xfer_descs(local_descs)
        remote = self.get_xfer_descs(remote_descs)
        if local is None or remote is None:
            raise nixlInvalidParamError(
                "initialize_xfer: no descriptor list for the %s side"
                % ("local" if local is None else "remote"))
        agent, ld, rd = self.agent, local.desclist(), remote.desclist()
        peer = self._peer(remote_agent)
        self._check_remote(peer, remote)

        def remake(n):
            return agent.create_xfer(operation, ld, rd, peer, n)
        h = nixl_xfer_handle(remake(notif), remake)
        if notif is not None:
            self._notif_of[h] = notif
        return h

    def transfer(self, handle, notif_msg=b""):
        """Posts the request: "DONE" or "PROC"; a failure raises the NIXL
        error class for it (nixlRemoteDisconnectError for a peer that is
        gone, ...), as NIXL's bindings do, with pdx's text."""
        if notif_msg:
            m = _notif_bytes(notif_msg, "transfer")
            if self._notif_of.get(handle) != m:
                self._renotify(handle, m)
        if isinstance(handle, nixl_xfer_handle):
            handle._posted = True
        return "DONE" if handle.post() else "PROC"

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
        return "DONE" if handle.check() else "PROC"

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
        handle.release()
        if self._zombies:
            self._reap()

    def estimate_xfer_cost(self, handle):
        raise nixlNotSupportedError("estimate_xfer_cost: pdx has no cost "
                                    "model")

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

    # -- metadata and peers --------------------------------------------
    def get_agent_metadata(self):
        return self.agent.describe()

    def add_remote_agent(self, metadata):
        """Loads the peer; its name as bytes (as NIXL returns it; every
        call here takes names as str or bytes)."""
        return self._load_md(metadata).encode()

    def remove_remote_agent(self, agent):
        agent = _name(agent)
        self.agent.unload_peer(agent)
        self._peers.discard(agent)
        self._allowed.pop(agent, None)
        if self._zombies:
            self._reap()

    def check_remote_metadata(self, agent, descs=None):
        """True while the peer is loaded and alive: False once it is
        unknown, removed, or known dead (its process exited, its endpoint
        failed)."""
        name = _name(agent)
        with self._md_lock:
            try:
                if self.agent.peer_state(name) != "alive":
                    return False
            except (_pdx.NotFound, _pdx.InvalidArgument):
                return False
            if descs is not None:
                d = self.get_xfer_descs(descs, "DRAM")
                return d is not None and self._covered(name, d)
            return True

    def make_connection(self, remote_agent, backends=()):
        """pdx connects when the peer is loaded: checks it is there and
        alive (nixlNotFoundError / nixlRemoteDisconnectError)."""
        name = _name(remote_agent)
        if self.agent.peer_state(name) != "alive":
            raise nixlRemoteDisconnectError(
                "make_connection: peer %s is disconnected" % name)

    def _load_md(self, md):
        md = bytes(md)
        rows = None
        if md.startswith(_PMD_MAGIC):
            off = len(_PMD_MAGIC)
            if len(md) < off + 4:
                raise nixlInvalidParamError("partial metadata: truncated "
                                            "count")
            (n,) = struct.unpack_from("<I", md, off)
            off += 4
            if n > _PMD_MAX_ROWS or len(md) < off + 24 * n:
                raise nixlInvalidParamError(
                    "partial metadata: %d regions do not fit %d bytes"
                    % (n, len(md)))
            rows = [tuple(int(v) for v in r) for r in np.frombuffer(
                md, "<u8", 3 * n, off).reshape(n, 3)]
            md = md[off + 24 * n:]
        with self._md_lock:
            name = self.agent.load_peer(md)
            self._peers.add(name)
            if rows is None:
                self._allowed[name] = None
            elif name not in self._allowed or \
                    self._allowed[name] is not None:
                cur = self._allowed.get(name) or []
                self._allowed[name] = sorted(set(cur) | set(rows))
        return name

    def _covered(self, name, descs):
        """Whether every (addr, len, dev) of descs is inside a region the
        peer's metadata named (always, after a full metadata)."""
        allowed = self._allowed.get(name)
        if allowed is None:
            return True
        # Registered regions of one device never overlap: the candidate
        # is the last one starting at or before addr.
        by_dev = {}
        for a, n, v in allowed:
            by_dev.setdefault(v, []).append((a, n))
        starts = {v: [a for a, _ in rs] for v, rs in by_dev.items()}
        for d in descs:
            addr, length, dev = int(d[0]), int(d[1]), int(d[2])
            rs = by_dev.get(dev)
            if not rs:
                return False
            i = bisect.bisect_right(starts[dev], addr) - 1
            if i < 0 or addr + length > rs[i][0] + rs[i][1]:
                return False
        return True

    def _check_remote(self, name, descs):
        if not self._covered(name, descs):
            raise nixlNotFoundError(
                "peer %s: descriptors outside the regions its metadata "
                "named so far (partial metadata)" % name)

    def get_partial_agent_metadata(self, descs, inc_conn_info=False,
                                   backends=()):
        """Metadata naming only `descs`' regions (pdx's format: the full
        blob plus those regions; the peer lets transfers use only the
        regions partial metadata named, as NIXL's partial metadata)."""
        if descs is None:
            regions = []
        elif isinstance(descs, nixl_reg_dlist):
            regions = [r[:3] for r in descs.regions]
        else:
            regions = list(self.get_xfer_descs(descs, "DRAM") or [])
        rows = np.array(regions or np.zeros((0, 3)), dtype="<u8")
        return _PMD_MAGIC + struct.pack("<I", len(regions)) + \
            rows.tobytes() + self.get_agent_metadata()

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """To the listener at ip_addr:port (it loads it), or, without
        ip_addr, to the etcd store (NIXL_ETCD_ENDPOINTS)."""
        if ip_addr:
            md = self.get_agent_metadata()
            try:
                with _lf_connect(ip_addr, port) as sock:
                    _lf_send(sock, _LF_MD, md)
            except OSError as e:
                raise nixlBackendError("send_local_metadata to %s:%s: %s"
                                       % (ip_addr, port, e)) from None
        elif self._store is not None:
            self.agent.publish()
        else:
            raise nixlNotSupportedError(
                "send_local_metadata: give ip_addr, or set "
                "NIXL_ETCD_ENDPOINTS for the etcd store")

    def send_partial_agent_metadata(self, descs, inc_conn_info=False,
                                    backends=(), ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        """To the listener at ip_addr:port (see get_partial_agent_metadata);
        to the etcd store (no ip_addr) the full metadata is published (the
        store keeps one blob per agent, label ignored)."""
        if not ip_addr:
            self.send_local_metadata()
            return
        md = self.get_partial_agent_metadata(descs, inc_conn_info)
        try:
            with _lf_connect(ip_addr, port) as sock:
                _lf_send(sock, _LF_MD, md)
        except OSError as e:
            raise nixlBackendError("send_partial_agent_metadata to %s:%s: %s"
                                   % (ip_addr, port, e)) from None

    def fetch_remote_metadata(self, remote_agent, ip_addr="",
                              port=DEFAULT_COMM_PORT, label=""):
        """Asks the listener at ip_addr:port (or the etcd store) for
        `remote_agent`'s metadata and loads it in the background, as NIXL:
        poll check_remote_metadata(remote_agent). Failures are logged."""
        name = _name(remote_agent)
        if not ip_addr and self._store is None:
            raise nixlNotSupportedError(
                "fetch_remote_metadata: give ip_addr, or set "
                "NIXL_ETCD_ENDPOINTS for the etcd store")
        t = threading.Thread(target=self._fetch, args=(name, ip_addr, port),
                             daemon=True, name="nixl-fetch-" + name)
        t.start()

    def _fetch(self, name, ip, port):
        try:
            if ip:
                with _lf_connect(ip, port) as sock:
                    _lf_send(sock, _LF_FETCH, name.encode())
                    kind, payload = _lf_recv(sock)
                if kind == _LF_ERR:
                    raise nixlBackendError(payload.decode(errors="replace"))
                if kind != _LF_MD:
                    raise ValueError("reply kind %d, not metadata" % kind)
                got = self._load_md(payload)
                if got != name:
                    self.remove_remote_agent(got)
                    raise nixlMismatchError("%s:%s answered as %s"
                                            % (ip, port, got))
            else:
                self.agent.fetch_peer(name, timeout=_LF_TIMEOUT)
                self._peers.add(name)
        except Exception as e:
            _log.error("agent %s: fetch_remote_metadata(%s, %s:%s): %s",
                       self.name, name, ip, port, e)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """Tells the listener at ip_addr:port to forget this agent. The
        etcd store keeps an agent's key while its lease lives (it goes at
        close()): without ip_addr this raises nixlNotSupportedError."""
        if not ip_addr:
            raise nixlNotSupportedError(
                "invalidate_local_metadata: pdx's store drops the key when "
                "the agent closes (its lease); give ip_addr for a listener")
        try:
            with _lf_connect(ip_addr, port) as sock:
                _lf_send(sock, _LF_INVAL, self.name.encode())
        except OSError as e:
            raise nixlBackendError("invalidate_local_metadata to %s:%s: %s"
                                   % (ip_addr, port, e)) from None

    # -- pdx extras ----------------------------------------------------
    def close(self):
        """Destroy the agent now (NIXL frees it at garbage collection):
        every registration, list and request of it goes too."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.agent.close()
        if self._shadow is not None:
            self._shadow.close()
            self._shadow = None
            self._shadow_regs = {}
        self._regs.clear()
        self._zombies.clear()
        self._peers.clear()
        self._notif_of.clear()


def install():
    """Make ``import nixl`` (and nixl_cu12, nixl_cu13, with their _api,
    _bindings, _utils and logging) resolve to pdx's shim packages, for
    stacks written against NIXL: SHIM_PATH goes first on sys.path and
    modules of those names already imported are dropped. Returns the
    'nixl' package."""
    import importlib
    if SHIM_PATH not in sys.path:
        sys.path.insert(0, SHIM_PATH)
    for m in [m for m in sys.modules
              if m.split(".")[0] in ("nixl", "nixl_cu12", "nixl_cu13")]:
        del sys.modules[m]
    return importlib.import_module("nixl")
