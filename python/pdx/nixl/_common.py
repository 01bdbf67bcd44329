"""pdx.nixl: NIXL's constants, error classes, handle and config
classes, and helpers shared by the other modules."""

import enum
import logging
import os

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

# Plugins pdx.nixl implements in Python rather than with a pdx backend:
# "POSIX" answers queryMem / query_memory on FILE descriptors (file stats,
# path in the metadata field) and, in nixl_agent, moves data between
# registered host memory and registered FILE regions (pdx.nixl._posix).
# Parameters and mem types as NIXL's POSIX plugin gives them.
_QUERY_PLUGINS = {"POSIX": ({}, ["FILE", "DRAM"])}


def _query_file(path):
    """NIXL's answer for one FILE descriptor: None when the file cannot
    be stat'ed, else its size, mode and mtime (as strings, as NIXL's
    backend parameters)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError, TypeError):
        return None
    return {"size": str(st.st_size), "mode": str(st.st_mode),
            "mtime": str(int(st.st_mtime))}


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


_log = logging.getLogger("nixl")


def _env_flag(name):
    """True/False for a set yes/no variable, None when unset or other."""
    v = os.environ.get(name, "").strip().lower()
    if v in ("y", "yes", "1", "true", "on"):
        return True
    if v in ("n", "no", "0", "false", "off"):
        return False
    return None


def _op(ops, operation):
    """NIXL's operation lookup: an unknown one is a KeyError, as in NIXL,
    naming it as an operation."""
    if operation not in ops:
        raise KeyError("operation %r: one of %s" % (operation,
                                                    ", ".join(ops)))
    return ops[operation]


def _mem(mems, mem_type):
    """NIXL's mem type lookup: an unknown name is a KeyError, as in NIXL."""
    if mem_type not in mems:
        raise KeyError("mem type %r: one of %s" % (mem_type,
                                                  ", ".join(mems)))
    return mems[mem_type]
