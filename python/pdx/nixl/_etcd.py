"""pdx.nixl: the keys of NIXL's etcd mode, through pdx's store module
(libpdx_store_etcd.so, its public ABI in pdx/store.h) called with ctypes.

The pdx agent's own store publishes its full description under
`<namespace>/agents/<name>` (liveness: it goes with the agent's lease).
NIXL's calls also need keys the agent API does not have: metadata under a
label (partial metadata) and removing what was sent
(invalidate_local_metadata). They go to NIXL's key layout,
`<namespace>/<agent>/<label>` (label "metadata" for the full metadata),
put under this client's own lease, so they vanish with the process too.
The values are pdx blobs, not NIXL's: pdx and NIXL agents do not read each
other's keys."""

import ctypes as _ct
import os
import threading
import time

PDX_OK = 0
PDX_INPROGRESS = 1
PDX_ERR_NOT_FOUND = -3
_ABI_VERSION = 1
PUT_LEASED = 1
# NIXL's label of the full metadata (sendLocalMD, fetchRemoteMD without a
# label).
DEFAULT_LABEL = "metadata"

_WATCH_CB = _ct.CFUNCTYPE(None, _ct.c_void_p, _ct.c_uint64, _ct.c_void_p)


class _Params(_ct.Structure):
    _fields_ = [("endpoints", _ct.c_char_p), ("ns", _ct.c_char_p),
                ("lease_ttl_ms", _ct.c_uint32), ("timeout_ms", _ct.c_uint32),
                ("retry_min_ms", _ct.c_uint32), ("retry_max_ms", _ct.c_uint32),
                ("max_txn_ops", _ct.c_uint32), ("opts", _ct.c_void_p),
                ("nopts", _ct.c_size_t)]


class _Host(_ct.Structure):
    _fields_ = [("ctx", _ct.c_void_p), ("agent_name", _ct.c_char_p),
                ("watch_event", _WATCH_CB), ("state_change", _ct.c_void_p)]


class _Status(_ct.Structure):
    # pdx_store_status_t (append-only, no size field: room to spare for a
    # newer module's fields).
    _fields_ = [("reachable", _ct.c_bool),
                ("unreachable_since_ns", _ct.c_uint64),
                ("unreachable_ms", _ct.c_uint64), ("lease", _ct.c_int64),
                ("lease_ttl_s", _ct.c_uint32),
                ("leases_granted", _ct.c_uint64), ("revision", _ct.c_int64),
                ("requests", _ct.c_uint64), ("failures", _ct.c_uint64),
                ("leased_keys", _ct.c_uint32), ("unpublished", _ct.c_uint32),
                ("watches", _ct.c_uint32), ("watches_down", _ct.c_uint32),
                ("endpoint", _ct.c_char * 128),
                ("last_error", _ct.c_char * 256),
                ("_spare", _ct.c_char * 4096)]


# The prefix of pdx_store_ops_t this client uses (the table is append-only).
class _Ops(_ct.Structure):
    _fields_ = [
        ("abi_version", _ct.c_uint32), ("size", _ct.c_uint32),
        ("name", _ct.c_char_p),
        ("query", _ct.CFUNCTYPE(_ct.c_int, _ct.c_char_p, _ct.c_size_t)),
        ("create", _ct.CFUNCTYPE(_ct.c_int, _ct.POINTER(_Host),
                                 _ct.POINTER(_Params),
                                 _ct.POINTER(_ct.c_void_p))),
        ("destroy", _ct.CFUNCTYPE(None, _ct.c_void_p)),
        ("status", _ct.CFUNCTYPE(None, _ct.c_void_p,
                                 _ct.POINTER(_Status))),
        ("put", _ct.CFUNCTYPE(_ct.c_int, _ct.c_void_p, _ct.c_char_p,
                              _ct.c_char_p, _ct.c_size_t, _ct.c_uint32)),
        ("get", _ct.CFUNCTYPE(_ct.c_int, _ct.c_void_p, _ct.c_char_p,
                              _ct.POINTER(_ct.c_void_p),
                              _ct.POINTER(_ct.c_size_t),
                              _ct.POINTER(_ct.c_int64))),
        ("del_", _ct.CFUNCTYPE(_ct.c_int, _ct.c_void_p, _ct.c_char_p)),
    ]


_libc = _ct.CDLL(None)
_libc.free.argtypes = [_ct.c_void_p]
_libc.free.restype = None


def _libpdx_dir():
    """The folder of the libpdx.so this process loaded (pdx's extension
    links it), as the core's loader uses it."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                base = os.path.basename(path)
                if base == "libpdx.so" or base.startswith("libpdx.so."):
                    return os.path.dirname(path)
    except OSError:
        pass
    return ""


def _module_path(kind):
    """libpdx_store_<kind>.so where the core's loader looks: each folder
    of PDX_PLUGIN_PATH, then <dir of libpdx.so>/pdx/, then that dir."""
    file = "libpdx_store_%s.so" % kind
    dirs = [d for d in os.environ.get("PDX_PLUGIN_PATH", "").split(":") if d]
    own = _libpdx_dir()
    if own:
        dirs += [os.path.join(own, "pdx"), own]
    for d in dirs:
        p = os.path.join(d, file)
        if os.path.exists(p):
            return p
    raise OSError("%s not found in PDX_PLUGIN_PATH or next to libpdx.so"
                  % file)


@_WATCH_CB
def _no_watch(ctx, watch_id, ev):
    pass


class Store:
    """One client of pdx's store module: put (under its own lease), get
    and delete of keys relative to `namespace`. Every call blocks at most
    `timeout` seconds; an unreachable store raises OSError. Thread-safe:
    calls are serialised, and close() waits for the one in progress (the
    module's instance is never used after it is destroyed)."""

    def __init__(self, endpoints, namespace, kind="etcd", lease_ttl=10.0,
                 timeout=2.0, name="pdx.nixl"):
        self._dl = _ct.CDLL(_module_path(kind))
        ops_p = _ct.cast(self._dl.pdx_store_v1, _ct.POINTER(_Ops))
        if ops_p.contents.abi_version != _ABI_VERSION or \
                ops_p.contents.size < _ct.sizeof(_Ops):
            raise OSError("libpdx_store_%s.so: ABI %d (size %d), not %d"
                          % (kind, ops_p.contents.abi_version,
                             ops_p.contents.size, _ABI_VERSION))
        self._ops = ops_p.contents
        # The module keeps pointers to host and copies the params' strings.
        self._name = name.encode()
        self._host = _Host(None, self._name, _no_watch, None)
        params = _Params(",".join(endpoints).encode(),
                         namespace.rstrip("/").encode() or b"/",
                         int(lease_ttl * 1000), int(timeout * 1000),
                         0, 0, 0, None, 0)
        self._lock = threading.Lock()
        st = _ct.c_void_p()
        rc = self._ops.create(_ct.byref(self._host), _ct.byref(params),
                              _ct.byref(st))
        if rc != PDX_OK:
            raise OSError("store %s at %s (namespace %s): status %d"
                          % (kind, ",".join(endpoints), namespace, rc))
        self._st = st
        self._timeout = timeout
        # Leased puts are immediate once the lease is granted (before, the
        # module remembers them and puts them when it is).
        self._wait(lambda s: s.lease != 0)

    def _wait(self, done):
        """Polls the instance's status until done(status) or `timeout`;
        whether it got there."""
        end = time.monotonic() + self._timeout
        s = _Status()
        for _ in range(int(self._timeout / 0.005) + 2):
            with self._lock:
                self._ops.status(self._live(), _ct.byref(s))
            if done(s):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)
        return False

    @property
    def closed(self):
        return self._st is None

    def _live(self):
        if self._st is None:
            raise OSError("store client closed")
        return self._st

    def put(self, key, value, leased=True):
        """True once stored; False while the store is unreachable and the
        leased key waits to be put when it is back."""
        value = bytes(value)
        with self._lock:
            rc = self._ops.put(self._live(), key.encode(), value, len(value),
                               PUT_LEASED if leased else 0)
        if rc not in (PDX_OK, PDX_INPROGRESS):
            raise OSError("store put %s: status %d" % (key, rc))
        if rc == PDX_INPROGRESS:  # published with the lease: wait a while
            return self._wait(lambda s: s.lease != 0 and s.unpublished == 0)
        return True

    def get(self, key):
        """The value (bytes), or None when the key is absent."""
        v, n, rev = _ct.c_void_p(), _ct.c_size_t(), _ct.c_int64()
        with self._lock:
            rc = self._ops.get(self._live(), key.encode(), _ct.byref(v),
                               _ct.byref(n), _ct.byref(rev))
        if rc == PDX_ERR_NOT_FOUND:
            return None
        if rc != PDX_OK:
            raise OSError("store get %s: status %d" % (key, rc))
        try:
            return _ct.string_at(v, n.value) if n.value else b""
        finally:
            _libc.free(v)

    def delete(self, key):
        with self._lock:
            rc = self._ops.del_(self._live(), key.encode())
        if rc != PDX_OK:
            raise OSError("store delete %s: status %d" % (key, rc))

    def close(self):
        """Revokes the lease (the leased keys go at once)."""
        with self._lock:
            st, self._st = self._st, None
            if st is not None:
                self._ops.destroy(st)
