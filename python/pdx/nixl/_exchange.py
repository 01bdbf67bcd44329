"""pdx.nixl: metadata exchange: peers, partial metadata, the listener
thread's framing and the etcd mode (nixl_agent's metadata calls, mixed
into it)."""

import bisect
import os
import socket
import struct
import threading
import time

import pdx as _pdx
from ._common import (  # noqa: F401
    DEFAULT_COMM_PORT,
    _log,
    _name,
    nixlBackendError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
)
from . import _etcd
from ._descs import (  # noqa: F401
    _rows_from_le_bytes,
    _rows_le_bytes,
    nixl_reg_dlist,
)


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
# fetch_remote_metadata over etcd waits this long for the key (NIXL's
# default etcd watch timeout), polling.
_ETCD_WAIT = 5.0
_ETCD_POLL = 0.02


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




class _MetadataExchange:
    """nixl_agent's metadata calls: peers, partial metadata, the
    listener and etcd exchange (mixed into nixl_agent)."""

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
            rows = _rows_from_le_bytes(md, n, off)
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
        return _PMD_MAGIC + struct.pack("<I", len(regions)) + \
            _rows_le_bytes([tuple(r[:3]) for r in regions]) + \
            self.get_agent_metadata()

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """To the listener at ip_addr:port (it loads it), or, without
        ip_addr, to the etcd store (NIXL_ETCD_ENDPOINTS): under NIXL's
        key `<namespace>/<name>/metadata`, again after an invalidate."""
        if ip_addr:
            md = self.get_agent_metadata()
            try:
                with _lf_connect(ip_addr, port) as sock:
                    _lf_send(sock, _LF_MD, md)
            except OSError as e:
                raise nixlBackendError("send_local_metadata to %s:%s: %s"
                                       % (ip_addr, port, e)) from None
        elif self._store is not None:
            self._etcd_put(_etcd.DEFAULT_LABEL, self.get_agent_metadata())
        else:
            raise nixlNotSupportedError(
                "send_local_metadata: give ip_addr, or set "
                "NIXL_ETCD_ENDPOINTS for the etcd store")

    def send_partial_agent_metadata(self, descs, inc_conn_info=False,
                                    backends=(), ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        """To the listener at ip_addr:port, or, without ip_addr, to the
        etcd store under `label` (required there, as NIXL): a peer that
        fetches that label may use only the regions named (see
        get_partial_agent_metadata)."""
        if not ip_addr:
            if self._store is None:
                raise nixlNotSupportedError(
                    "send_partial_agent_metadata: give ip_addr, or set "
                    "NIXL_ETCD_ENDPOINTS for the etcd store")
            if not label:
                raise nixlInvalidParamError(
                    "send_partial_agent_metadata: a label is required to "
                    "send partial metadata to the etcd store")
            self._etcd_put(label, self.get_partial_agent_metadata(
                descs, inc_conn_info))
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
        """Asks the listener at ip_addr:port, or the etcd store (the
        metadata sent under `label`, by default the full metadata; waits
        up to 5 s for it to appear, as NIXL's watch), for `remote_agent`'s
        metadata and loads it in the background, as NIXL: poll
        check_remote_metadata(remote_agent). Failures are logged."""
        name = _name(remote_agent)
        if not ip_addr and self._store is None:
            raise nixlNotSupportedError(
                "fetch_remote_metadata: give ip_addr, or set "
                "NIXL_ETCD_ENDPOINTS for the etcd store")
        t = threading.Thread(target=self._fetch,
                             args=(name, ip_addr, port, label),
                             daemon=True, name="nixl-fetch-" + name)
        t.start()

    def _fetch(self, name, ip, port, label=""):
        try:
            if ip:
                with _lf_connect(ip, port) as sock:
                    _lf_send(sock, _LF_FETCH, name.encode())
                    kind, payload = _lf_recv(sock)
                if kind == _LF_ERR:
                    raise nixlBackendError(payload.decode(errors="replace"))
                if kind != _LF_MD:
                    raise ValueError("reply kind %d, not metadata" % kind)
            else:
                payload = self._etcd_wait(name, label or _etcd.DEFAULT_LABEL)
            got = self._load_md(payload)
            if got != name:
                self.remove_remote_agent(got)
                raise nixlMismatchError("%s answered as %s"
                                        % ("%s:%s" % (ip, port) if ip
                                           else "etcd key of " + name, got))
        except Exception as e:
            _log.error("agent %s: fetch_remote_metadata(%s, %s:%s, %r): %s",
                       self.name, name, ip, port, label, e)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        """Tells the listener at ip_addr:port to forget this agent, or,
        without ip_addr, removes every metadata key this agent sent to the
        etcd store (full and labelled; send_local_metadata publishes
        again). Peers that already loaded it keep it (pdx does not watch
        NIXL's keys)."""
        if not ip_addr:
            if self._store is None:
                raise nixlNotSupportedError(
                    "invalidate_local_metadata: give ip_addr, or set "
                    "NIXL_ETCD_ENDPOINTS for the etcd store")
            self._etcd_invalidate()
            return
        try:
            with _lf_connect(ip_addr, port) as sock:
                _lf_send(sock, _LF_INVAL, self.name.encode())
        except OSError as e:
            raise nixlBackendError("invalidate_local_metadata to %s:%s: %s"
                                   % (ip_addr, port, e)) from None

    # -- etcd mode (_etcd.py) ------------------------------------------
    def _etcd_client(self):
        with self._md_lock:
            if self._etcd is None:
                try:
                    self._etcd = _etcd.Store(
                        self._store["endpoints"], self._store["namespace"],
                        name=self.name)
                except OSError as e:
                    raise nixlBackendError("etcd store: %s" % e) from None
            return self._etcd

    def _etcd_key(self, name, label):
        return "%s/%s" % (name, label)

    def _etcd_put(self, label, md):
        # The agent's own key (agents/<name>) carries its liveness: a
        # peer that loads it from NIXL's keys sees it die with its lease.
        self.agent.publish()
        st = self._etcd_client()
        key = self._etcd_key(self.name, label)
        try:
            st.put(key, md)
        except OSError as e:
            raise nixlBackendError("send metadata to etcd: %s" % e) from None
        with self._md_lock:
            self._etcd_sent.add(key)

    def _etcd_wait(self, name, label):
        st = self._etcd_client()
        key = self._etcd_key(name, label)
        end = time.monotonic() + _ETCD_WAIT
        for _ in range(int(_ETCD_WAIT / _ETCD_POLL) + 1):
            try:
                md = st.get(key)
            except OSError as e:  # unreachable: try again until the end
                if st.closed:
                    raise
                _log.debug("agent %s: %s", self.name, e)
                md = None
            if md:
                return md
            if time.monotonic() >= end:
                break
            time.sleep(_ETCD_POLL)
        raise nixlNotFoundError("etcd: no metadata of %s under label %r "
                                "after %.0f s" % (name, label, _ETCD_WAIT))

    def _etcd_invalidate(self):
        with self._md_lock:
            keys, self._etcd_sent = sorted(self._etcd_sent), set()
        if not keys:
            return
        st = self._etcd_client()
        for key in keys:
            try:
                st.delete(key)
            except OSError as e:
                raise nixlBackendError("invalidate_local_metadata: %s"
                                       % e) from None

    def _etcd_close(self):
        st, self._etcd = self._etcd, None
        if st is not None:
            st.close()
