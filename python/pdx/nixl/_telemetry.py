"""pdx.nixl: the shared-memory telemetry file NIXL's core writes (its
"BUFFER" exporter), so that NIXL's telemetry readers
(examples/python/telemetry_reader.py) read pdx.nixl agents.

With telemetry on (NIXL_TELEMETRY_ENABLE=y, or capture_telemetry without
=n) and NIXL_TELEMETRY_DIR set, the agent writes events to the file
$NIXL_TELEMETRY_DIR/<agent name>: NIXL's cyclic buffer, version 4, laid
out as NIXL's sharedRingBuffer<nixlTelemetryEvent>:

    header (40 bytes): write_pos u64, read_pos u64, version i32,
                       expected_version i32, capacity u64, mask u64
    capacity events of 16 bytes: event_type u32, 4 bytes padding, value u64

capacity is NIXL_TELEMETRY_BUFFER_SIZE (default 4096, a power of two).
The writer owns write_pos, the reader read_pos; a full buffer drops the
event and the count is written later as AGENT_TELEMETRY_EVENTS_DROPPED,
as NIXL. Events are written when they happen (NIXL's core stages them and
flushes every 100 ms): memory registered/deregistered (bytes), per
finished request its post time and transfer time (microseconds), bytes
(TX for WRITE, RX for READ) and one request, and one event per error
NIXL counts (AGENT_ERR_*). NIXL_TELEMETRY_ENABLED_METRICS (comma
separated fnmatch patterns of the event names) limits them as NIXL's."""

import fnmatch
import mmap
import os
import struct
import threading

import pdx as _pdx

from ._common import _log

TELEMETRY_VERSION = 4
_HDR = struct.Struct("=QQiiQQ")
_EVT = struct.Struct("=I4xQ")

EVENT_NAMES = [
    "agent_tx_bytes", "agent_rx_bytes", "agent_tx_requests_num",
    "agent_rx_requests_num", "agent_memory_registered",
    "agent_memory_deregistered", "agent_xfer_time", "agent_xfer_post_time",
    "agent_err_not_posted", "agent_err_invalid_param", "agent_err_backend",
    "agent_err_not_found", "agent_err_mismatch", "agent_err_not_allowed",
    "agent_err_repost_active", "agent_err_unknown", "agent_err_not_supported",
    "agent_err_remote_disconnect", "agent_err_canceled",
    "agent_err_no_telemetry", "agent_telemetry_events_dropped",
]
(TX_BYTES, RX_BYTES, TX_REQUESTS_NUM, RX_REQUESTS_NUM, MEMORY_REGISTERED,
 MEMORY_DEREGISTERED, XFER_TIME, XFER_POST_TIME, ERR_NOT_POSTED,
 ERR_INVALID_PARAM, ERR_BACKEND, ERR_NOT_FOUND, ERR_MISMATCH,
 ERR_NOT_ALLOWED, ERR_REPOST_ACTIVE, ERR_UNKNOWN, ERR_NOT_SUPPORTED,
 ERR_REMOTE_DISCONNECT, ERR_CANCELED, ERR_NO_TELEMETRY,
 EVENTS_DROPPED) = range(len(EVENT_NAMES))


def error_event(exc):
    """The AGENT_ERR_* event for an exception a call raised."""
    from ._common import nixlNoTelemetryError, nixlRepostActiveError
    table = [
        (nixlRepostActiveError, ERR_REPOST_ACTIVE),
        (nixlNoTelemetryError, ERR_NO_TELEMETRY),
        (_pdx.InvalidArgument, ERR_INVALID_PARAM),
        (_pdx.NotFound, ERR_NOT_FOUND),
        (_pdx.BackendError, ERR_BACKEND),
        (_pdx.RemoteDisconnect, ERR_REMOTE_DISCONNECT),
        (_pdx.Unsupported, ERR_NOT_SUPPORTED),
        (_pdx.PolicyError, ERR_NOT_ALLOWED),
        (_pdx.Mismatch, ERR_MISMATCH),
        (_pdx.Canceled, ERR_CANCELED),
        (_pdx.Closed, ERR_NOT_POSTED),
    ]
    for cls, ev in table:
        if isinstance(exc, cls):
            return ev
    return ERR_UNKNOWN


def _enabled_mask():
    spec = os.environ.get("NIXL_TELEMETRY_ENABLED_METRICS", "")
    toks = {t.strip() for t in spec.split(",") if t.strip()}
    if not toks:
        return [True] * len(EVENT_NAMES)
    return [any(fnmatch.fnmatchcase(n, t) for t in toks) for n in EVENT_NAMES]


class RingWriter:
    """NIXL's telemetry file for one agent (see the module docstring)."""

    def __init__(self, path, capacity):
        if capacity <= 0 or capacity & (capacity - 1):
            raise ValueError("NIXL_TELEMETRY_BUFFER_SIZE must be a power of "
                             "2, not %d" % capacity)
        self.path = path
        self.capacity = capacity
        self._mask = _enabled_mask()
        self._lock = threading.Lock()
        self._dropped = 0
        size = _HDR.size + _EVT.size * capacity
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _HDR.pack_into(self._mm, 0, 0, 0, TELEMETRY_VERSION,
                       TELEMETRY_VERSION, capacity, capacity - 1)

    def _push(self, ev, value):
        mm = self._mm
        wpos = struct.unpack_from("=Q", mm, 0)[0]
        rpos = struct.unpack_from("=Q", mm, 8)[0]
        nxt = (wpos + 1) & (self.capacity - 1)
        if nxt == rpos:
            return False
        _EVT.pack_into(mm, _HDR.size + _EVT.size * wpos, ev, value)
        # The event is in place before write_pos names it (x86: stores
        # are not reordered; the reader loads write_pos first).
        struct.pack_into("=Q", mm, 0, nxt)
        return True

    def emit(self, *events):
        """Writes (event, value) pairs, all or none (NIXL's batches)."""
        events = [(e, int(v)) for e, v in events if self._mask[e]]
        if not events:
            return
        with self._lock:
            if self._mm is None:
                return
            wpos = struct.unpack_from("=Q", self._mm, 0)[0]
            rpos = struct.unpack_from("=Q", self._mm, 8)[0]
            free = self.capacity - 1 - ((wpos - rpos) & (self.capacity - 1))
            if free < len(events) + (1 if self._dropped else 0):
                self._dropped += len(events)
                return
            if self._dropped and self._mask[EVENTS_DROPPED]:
                self._push(EVENTS_DROPPED, self._dropped)
            self._dropped = 0
            for e, v in events:
                self._push(e, max(0, v) & 0xFFFFFFFFFFFFFFFF)

    def close(self):
        with self._lock:
            if self._mm is not None:
                self._mm.flush()
                self._mm.close()
                self._mm = None


def make_writer(agent_name, enabled):
    """The agent's writer, or None (telemetry off, or no
    NIXL_TELEMETRY_DIR, or another exporter named)."""
    if not enabled:
        return None
    d = os.environ.get("NIXL_TELEMETRY_DIR")
    exporter = os.environ.get("NIXL_TELEMETRY_EXPORTER", "").strip()
    if not d or (exporter and exporter.upper() != "BUFFER"):
        return None
    try:
        cap = int(os.environ.get("NIXL_TELEMETRY_BUFFER_SIZE", "4096"))
        return RingWriter(os.path.join(d, agent_name), cap)
    except (OSError, ValueError) as e:
        _log.error("telemetry file %s/%s: %s", d, agent_name, e)
        return None
