"""pdx.nixl: metadata exchange: peers, partial metadata, the listener
thread's framing and the etcd mode (nixl_agent's metadata calls, mixed
into it)."""

import bisect
import hashlib
import hmac
import os
import re
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
    nixlNotAllowedError,
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
# The listener opens every connection with CHAL: a random nonce and
# whether it holds a cluster key. The client's request (one per
# connection) is a frame whose payload is a version byte (1), a MAC (32
# bytes), a u16-prefixed agent name and the body:
#   MD     the name in the blob; the body a metadata to load
#   FETCH  the agent asked for ("send me yours": the reply is an MD frame
#          with the listener's metadata, or ERR with the reason)
#   INVAL  the sender ("forget me")
# With a cluster key (PDX_CLUSTER_KEY_FILE, as the C agent reads it) the
# MAC is HMAC-SHA-256(key, "pdx.nixl listen v1" NUL, nonce, kind, the u16
# name length, name, body), and a frame whose MAC does not verify is
# refused: only key holders may push, fetch or invalidate, and a captured
# frame is no good on another connection. Without a key the MAC is zeros
# and the listener is an open capability server (docs/NIXL.md): it then
# takes INVAL only from the address the named peer's metadata came from,
# refuses an MD that would replace a live peer's instance, and loads at
# most PDX_NIXL_MAX_PUSHED peers nobody asked for. Everything read is
# bounded: a whole frame within _LF_TIMEOUT, sizes, concurrent connections
# (per source too); a blob is loaded through pdx's checks.
_LF_MAGIC = b"PDXL"
_LF_HDR = struct.Struct("<4sBI")
_LF_MD, _LF_FETCH, _LF_INVAL, _LF_ERR, _LF_CHAL = 1, 2, 3, 4, 5
_LF_KINDS = (_LF_MD, _LF_FETCH, _LF_INVAL, _LF_ERR, _LF_CHAL)
_LF_MAX = 64 << 20
_LF_VERSION = 1
_LF_MAC_CTX = b"pdx.nixl listen v1\0"
_LF_NONCE = 32
# Concurrent connections served, in all and from one address; unsolicited
# peers (pushed by MD frames, not fetched) a keyless listener loads.
_LF_MAX_CONNS = 64
_LF_MAX_PER_SOURCE = 8
_LF_MAX_PUSHED = int(os.environ.get("PDX_NIXL_MAX_PUSHED", "256") or 256)
# Partial metadata (get_partial_agent_metadata): b"PDXPMD1\0", a u32 count,
# that many (addr, len, device) u64 rows, then the agent's full blob. The
# receiver loads the blob but lets transfers use only the regions some
# partial metadata named, as NIXL (a full metadata lifts that). Each row
# must lie inside a region of the blob; a peer's rows are merged and
# capped at _PMD_MAX_ROWS.
_PMD_MAGIC = b"PDXPMD1\0"
_PMD_MAX_ROWS = 1 << 16
# A whole frame (request or reply) is read within this, not per recv.
_LF_TIMEOUT = 5.0
# fetch_remote_metadata over etcd waits this long for the key (NIXL's
# default etcd watch timeout), polling.
_ETCD_WAIT = 5.0
_ETCD_POLL = 0.02


def _cluster_key():
    """The cluster key the C agent uses from the environment
    (PDX_CLUSTER_KEY_FILE: 16 to 4096 bytes, one trailing newline
    dropped), or None."""
    path = os.environ.get("PDX_CLUSTER_KEY_FILE", "")
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            key = f.read(4098)
    except OSError as e:
        raise nixlBackendError("PDX_CLUSTER_KEY_FILE %s: %s"
                               % (path, e)) from None
    if key.endswith(b"\n"):
        key = key[:-1]
    if not 16 <= len(key) <= 4096:
        raise nixlBackendError("PDX_CLUSTER_KEY_FILE %s: a key is 16 to "
                               "4096 bytes, not %d" % (path, len(key)))
    return key


def _lf_mac(key, nonce, kind, name, body):
    nb = name.encode()
    if key is None:
        return bytes(32)
    return hmac.new(key, _LF_MAC_CTX + nonce + bytes([kind]) +
                    struct.pack("<H", len(nb)) + nb + body,
                    hashlib.sha256).digest()


def _lf_send(sock, kind, payload):
    sock.sendall(_LF_HDR.pack(_LF_MAGIC, kind, len(payload)) + payload)


def _lf_recv_exact(sock, n, deadline):
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no whole frame within %.0f s (%d of %d "
                                 "bytes)" % (_LF_TIMEOUT, len(out), n))
        sock.settimeout(left)
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed after %d of %d bytes"
                                  % (len(out), n))
        out += chunk
    return bytes(out)


def _lf_recv(sock, max_len=_LF_MAX, timeout=_LF_TIMEOUT):
    """One whole frame within `timeout` (however it trickles in), of at
    most max_len bytes: (kind, payload)."""
    deadline = time.monotonic() + timeout
    magic, kind, n = _LF_HDR.unpack(
        _lf_recv_exact(sock, _LF_HDR.size, deadline))
    if magic != _LF_MAGIC:
        raise ValueError("not a pdx.nixl metadata frame (magic %r)" % magic)
    if kind not in _LF_KINDS:
        raise ValueError("frame kind %d unknown" % kind)
    if n > max_len:
        raise ValueError("frame of %d bytes, at most %d" % (n, max_len))
    return kind, _lf_recv_exact(sock, n, deadline)


def _lf_connect(ip, port):
    return socket.create_connection((ip, int(port)), timeout=_LF_TIMEOUT)


def _lf_request(ip, port, kind, name, body=b"", reply=False):
    """One request to the listener at ip:port: its challenge read, the
    frame sent MACed with our key (if any); with `reply`, the answer
    frame (kind, payload), read whole within _LF_TIMEOUT."""
    key = _cluster_key()
    with _lf_connect(ip, port) as sock:
        ck, chal = _lf_recv(sock, 64)
        if ck != _LF_CHAL or len(chal) != _LF_NONCE + 1:
            raise ValueError("the listener did not open with a challenge "
                             "(kind %d, %d bytes): not a pdx.nixl listener "
                             "of this version" % (ck, len(chal)))
        nonce = chal[:_LF_NONCE]
        if chal[_LF_NONCE] and key is None:
            raise nixlBackendError(
                "the listener at %s:%s takes frames signed with the "
                "cluster key, and this process has none "
                "(PDX_CLUSTER_KEY_FILE)" % (ip, port))
        nb = name.encode()
        _lf_send(sock, kind, bytes([_LF_VERSION]) +
                 _lf_mac(key, nonce, kind, name, body) +
                 struct.pack("<H", len(nb)) + nb + body)
        if reply:
            return _lf_recv(sock)
        return None


def _valid_name(name, what="agent name"):
    """An agent name that is safe as a key part and a log word: 1 to 63
    of [A-Za-z0-9._-] (pdx's own rule), not "." or ".."."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or \
            name in (".", ".."):
        raise nixlInvalidParamError(
            "%s %r: 1 to 63 characters of [A-Za-z0-9._-], not '.' or '..'"
            % (what, name))
    return name


def _valid_label(label):
    if not isinstance(label, str) or not _LABEL_RE.fullmatch(label) or \
            label in (".", ".."):
        raise nixlInvalidParamError(
            "label %r: 1 to 128 characters of [A-Za-z0-9._-], not '.' or "
            "'..' (it becomes a part of an etcd key)" % (label,))
    return label


_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,63}")
_LABEL_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _blob_ident(md):
    """(name, instance) a metadata blob (or partial metadata) says, read
    without loading it (pdx.blob_describe: every field checked; a signed
    blob's envelope is not verified here, loading verifies it)."""
    md = bytes(md)
    if md.startswith(_PMD_MAGIC) and len(md) >= len(_PMD_MAGIC) + 4:
        (n,) = struct.unpack_from("<I", md, len(_PMD_MAGIC))
        md = md[len(_PMD_MAGIC) + 4 + 24 * min(n, _LF_MAX):]
    try:
        text = _pdx.blob_describe(md)
    except _pdx.Corrupt:
        raise  # as loading it would: nixlInvalidParamError is for the rest
    except Exception as e:
        raise nixlInvalidParamError("metadata does not parse: %s" % e) \
            from None
    name = inst = None
    for line in text.splitlines()[:4]:
        k, _, v = line.partition(":")
        if k == "agent":
            name = v.strip()
        elif k == "instance":
            inst = v.strip()
    if not name:
        raise nixlInvalidParamError("metadata names no agent")
    return name, inst


class _Listener:
    """The listener thread of a nixl_agent (enable_listen_thread): serves
    MD, FETCH and INVAL frames on (PDX_NIXL_LISTEN_ADDR or all addresses,
    as NIXL, listen_port; 0 picks a free port, see .port), each connection
    on a thread of its own (at most _LF_MAX_CONNS, _LF_MAX_PER_SOURCE from
    one address). An accept error (out of fds, a connection aborted) is
    logged and retried after a pause; it never ends the listener."""

    def __init__(self, owner, port):
        self.owner = owner
        self.key = _cluster_key()
        addr = os.environ.get("PDX_NIXL_LISTEN_ADDR", "")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((addr, int(port)))
            self.sock.listen(64)
        except OSError as e:
            self.sock.close()
            raise nixlBackendError("listener of %s on port %s: %s"
                                   % (owner.name, port, e)) from None
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._conns = {}     # source address -> connections being served
        self._nconns = 0
        self._threads = set()
        self.accept_errors = 0
        self.refused = 0
        self._quiet_until = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="nixl-listen-" + owner.name)
        self.thread.start()

    def _note(self, fmt, *args):
        """A refusal or error line, at most one a second (a flood of
        connections must not flood the log)."""
        now = time.monotonic()
        if now >= self._quiet_until:
            self._quiet_until = now + 1.0
            _log.error(fmt, *args)

    def _run(self):
        pause = 0.01
        while not self.stop.is_set():
            try:
                conn, who = self.sock.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self.stop.is_set():
                    break
                # EMFILE, ENFILE, ENOBUFS, ECONNABORTED...: the listening
                # socket is still good; the backlog waits meanwhile.
                self.accept_errors += 1
                self._note("agent %s: listener: accept: %s (retrying in "
                           "%.2f s)", self.owner.name, e, pause)
                self.stop.wait(pause)
                pause = min(pause * 2, 1.0)
                continue
            pause = 0.01
            src = who[0]
            with self._lock:
                busy = self._nconns >= _LF_MAX_CONNS or \
                    self._conns.get(src, 0) >= _LF_MAX_PER_SOURCE
                if not busy:
                    self._nconns += 1
                    self._conns[src] = self._conns.get(src, 0) + 1
            if busy:
                self.refused += 1
                self._note("agent %s: listener: %s:%d refused: %d "
                           "connections open (%d from it)", self.owner.name,
                           src, who[1], self._nconns, self._conns.get(src, 0))
                conn.close()
                continue
            t = threading.Thread(target=self._conn_main, args=(conn, who),
                                 daemon=True,
                                 name="nixl-listen-conn-" + self.owner.name)
            with self._lock:
                self._threads.add(t)
            t.start()

    def _conn_main(self, conn, who):
        try:
            with conn:
                self._serve(conn, who)
        except Exception as e:  # a bad peer never stops us
            self._note("agent %s: metadata from %s:%d refused: %s",
                       self.owner.name, who[0], who[1], e)
        finally:
            with self._lock:
                self._nconns -= 1
                left = self._conns.get(who[0], 1) - 1
                if left > 0:
                    self._conns[who[0]] = left
                else:
                    self._conns.pop(who[0], None)
                self._threads.discard(threading.current_thread())

    def _serve(self, conn, who):
        nonce = os.urandom(_LF_NONCE)
        conn.settimeout(_LF_TIMEOUT)
        _lf_send(conn, _LF_CHAL, nonce + bytes([self.key is not None]))
        kind, payload = _lf_recv(conn)
        if kind not in (_LF_MD, _LF_FETCH, _LF_INVAL):
            raise ValueError("unexpected frame kind %d" % kind)
        if len(payload) < 35 or payload[0] != _LF_VERSION:
            raise ValueError("request of version %d (%d bytes), this "
                             "listener speaks %d"
                             % (payload[0] if payload else -1, len(payload),
                                _LF_VERSION))
        mac = payload[1:33]
        (nl,) = struct.unpack_from("<H", payload, 33)
        if 35 + nl > len(payload):
            raise ValueError("name of %d bytes in a %d-byte request"
                             % (nl, len(payload)))
        name = payload[35:35 + nl].decode("ascii", errors="replace")
        body = payload[35 + nl:]
        if self.key is not None and not hmac.compare_digest(
                mac, _lf_mac(self.key, nonce, kind, name, body)):
            _lf_send(conn, _LF_ERR, b"refused: the frame is not signed "
                     b"with this listener's cluster key")
            raise PermissionError("%s frame for %r not signed with our "
                                  "cluster key"
                                  % ({_LF_MD: "MD", _LF_FETCH: "FETCH",
                                      _LF_INVAL: "INVAL"}[kind], name))
        agent = self.owner
        if kind == _LF_MD:
            agent._load_pushed(body, name, who[0], self.key is not None)
        elif kind == _LF_FETCH:
            if name != agent.name:
                _lf_send(conn, _LF_ERR, ("this listener is agent %s, not %s"
                                         % (agent.name, name)).encode())
                return
            try:
                md = agent.get_agent_metadata()
            except Exception as e:
                _lf_send(conn, _LF_ERR, str(e).encode())
                return
            _lf_send(conn, _LF_MD, md)
        else:
            agent._invalidate_pushed(name, who[0], self.key is not None)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(_LF_TIMEOUT + 1)


def _blob_regions(md):
    """The (addr, len, dev) of every region a blob lists (its text, see
    _blob_ident)."""
    out = []
    for line in _pdx.blob_describe(bytes(md)).splitlines():
        m = _REGION_RE.match(line)
        if m:
            out.append((int(m.group(2), 16), int(m.group(3)),
                        int(m.group(4))))
    return out


_REGION_RE = re.compile(r"\s+(DRAM|VRAM) 0x([0-9a-f]+) \+(\d+) dev (\d+)")


def _pmd_rows(name, rows, regions):
    """Partial metadata rows as (addr, len, dev) tuples, each checked to
    lie inside one of the blob's regions (of its device)."""
    by_dev = {}
    for a, n, d in regions:
        by_dev.setdefault(d, []).append((a, n))
    for rs in by_dev.values():
        rs.sort()
    out = []
    for r in rows:
        a, n, d = int(r[0]), int(r[1]), int(r[2])
        rs = by_dev.get(d, [])
        i = bisect.bisect_right(rs, (a, float("inf"))) - 1
        if n == 0 or i < 0 or a + n > rs[i][0] + rs[i][1]:
            raise nixlInvalidParamError(
                "partial metadata of %s: region 0x%x+%d (device %d) is not "
                "inside a region of its metadata" % (name, a, n, d))
        out.append((a, n, d))
    return out


def _merge_rows(rows):
    """Rows sorted by device and address, overlapping ones merged."""
    out = []
    for a, n, d in sorted(set(rows), key=lambda r: (r[2], r[0])):
        if out and out[-1][2] == d and a <= out[-1][0] + out[-1][1]:
            pa, pn, _ = out[-1]
            out[-1] = (pa, max(pa + pn, a + n) - pa, d)
        else:
            out.append((a, n, d))
    return out


def _rows_index(rows):
    """(starts by device, rows by device) for _covered's bisection."""
    by_dev = {}
    for a, n, d in rows:
        by_dev.setdefault(d, []).append((a, n))
    return {d: [a for a, _ in rs] for d, rs in by_dev.items()}, by_dev


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
        with self._md_lock:
            self.agent.unload_peer(agent)
            self._forget_peer(agent)
        if self._zombies:
            self._reap()

    def _forget_peer(self, name):
        self._peers.discard(name)
        self._allowed.pop(name, None)
        self._allowed_ix.pop(name, None)
        self._md_from.pop(name, None)
        self._pushed.discard(name)

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

    def _load_md(self, md, expect=None, origin=None):
        """Load a metadata (or partial metadata) and return the peer's
        name. `expect`: the name it must carry (a fetch); checked before
        anything loaded is touched. Partial metadata rows must each lie
        inside a region of the blob; a peer's rows are merged, capped at
        _PMD_MAX_ROWS, and indexed once for _covered."""
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
                    "partial metadata: %d regions (at most %d) do not fit "
                    "%d bytes" % (n, _PMD_MAX_ROWS, len(md)))
            rows = _rows_from_le_bytes(md, n, off)
            md = md[off + 24 * n:]
        name, _ = _blob_ident(md)
        if expect is not None and name != expect:
            raise nixlMismatchError(
                "metadata of agent %s where %s was asked for: not loaded "
                "(nothing loaded was touched)" % (name, expect))
        if rows is not None:
            rows = _pmd_rows(name, rows, _blob_regions(md))
        with self._md_lock:
            if rows is not None and self._allowed.get(name, 0) is not None:
                cur = self._allowed.get(name) or []
                merged = _merge_rows(cur + rows)
                if len(merged) > _PMD_MAX_ROWS:
                    raise nixlInvalidParamError(
                        "partial metadata of %s: %d regions named in all, "
                        "at most %d" % (name, len(merged), _PMD_MAX_ROWS))
            got = self.agent.load_peer(md)
            self._peers.add(got)
            if origin is not None:
                self._md_from[got] = origin
            if rows is None:
                self._allowed[got] = None
                self._allowed_ix.pop(got, None)
            elif self._allowed.get(got, 0) is not None:
                self._allowed[got] = merged
                self._allowed_ix[got] = _rows_index(merged)
        return got

    def _load_pushed(self, body, claimed, src, keyed):
        """An MD frame the listener received from `src` (the sender
        claims to be `claimed`, and with a key proved it holds the key):
        refused when the blob is of another agent, when it would replace
        a live peer's instance (a restarted peer is found dead first), or,
        without a key, when PDX_NIXL_MAX_PUSHED unsolicited peers are
        loaded already."""
        name, inst = _blob_ident(body)
        if name != claimed:
            raise nixlMismatchError("frame for agent %r carries the "
                                    "metadata of %s" % (claimed, name))
        _valid_name(name)
        with self._md_lock:
            live = None
            try:
                if self.agent.peer_state(name) == "alive":
                    live = self.agent.peer_info(name).get("instance")
            except (_pdx.NotFound, _pdx.InvalidArgument):
                pass
            if live is not None and inst is not None and \
                    int(inst, 16) != int(live):
                raise nixlNotAllowedError(
                    "metadata of %s from %s would replace its live "
                    "instance %016x: refused (a restarted peer is loaded "
                    "once the old one is found dead)" % (name, src, live))
            if not keyed and name not in self._peers and \
                    len(self._pushed) >= _LF_MAX_PUSHED:
                raise nixlNotAllowedError(
                    "%d peers loaded from listener frames already (a "
                    "keyless listener loads at most PDX_NIXL_MAX_PUSHED=%d "
                    "unsolicited peers): %s refused"
                    % (len(self._pushed), _LF_MAX_PUSHED, name))
            got = self._load_md(body, expect=name, origin=src)
            if got not in self._fetched:
                self._pushed.add(got)
        return got

    def _invalidate_pushed(self, name, src, keyed):
        """An INVAL frame: forget `name`. Without a key only from the
        address its metadata came from (a peer loaded another way is
        removed by the application, not by a frame)."""
        with self._md_lock:
            if name not in self._peers:
                return
            if not keyed and self._md_from.get(name) != src:
                raise nixlNotAllowedError(
                    "INVAL of %s from %s refused: its metadata came from "
                    "%s" % (name, src,
                            self._md_from.get(name) or "no listener frame"))
            self.remove_remote_agent(name)

    def _covered(self, name, descs):
        """Whether every (addr, len, dev) of descs is inside a region the
        peer's metadata named (always, after a full metadata). The index
        is built when rows arrive, not per call."""
        if self._allowed.get(name) is None:
            return True
        starts, rows = self._allowed_ix.get(name, ({}, {}))
        for d in descs:
            addr, length, dev = int(d[0]), int(d[1]), int(d[2])
            rs = rows.get(dev)
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
                _lf_request(ip_addr, port, _LF_MD, self.name, md)
            except (OSError, ValueError) as e:
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
            _valid_label(label)
            self._etcd_put(label, self.get_partial_agent_metadata(
                descs, inc_conn_info))
            return
        md = self.get_partial_agent_metadata(descs, inc_conn_info)
        try:
            _lf_request(ip_addr, port, _LF_MD, self.name, md)
        except (OSError, ValueError) as e:
            raise nixlBackendError("send_partial_agent_metadata to %s:%s: %s"
                                   % (ip_addr, port, e)) from None

    def fetch_remote_metadata(self, remote_agent, ip_addr="",
                              port=DEFAULT_COMM_PORT, label=""):
        """Asks the listener at ip_addr:port, or the etcd store (the
        metadata sent under `label`, by default the full metadata; waits
        up to 5 s for it to appear, as NIXL's watch), for `remote_agent`'s
        metadata and loads it in the background, as NIXL: poll
        check_remote_metadata(remote_agent). Failures are logged."""
        name = _valid_name(_name(remote_agent))
        if label:
            _valid_label(label)
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
                # A whole reply within _LF_TIMEOUT, of at most _LF_MAX.
                kind, payload = _lf_request(ip, port, _LF_FETCH, name,
                                            reply=True)
                if kind == _LF_ERR:
                    raise nixlBackendError(payload.decode(errors="replace"))
                if kind != _LF_MD:
                    raise ValueError("reply kind %d, not metadata" % kind)
            else:
                payload = self._etcd_wait(name, label or _etcd.DEFAULT_LABEL)
            # The blob's name is checked before it is loaded: a listener
            # or an etcd key answering with another agent's metadata
            # touches nothing loaded.
            with self._md_lock:
                self._fetched.add(name)
            self._load_md(payload, expect=name, origin=ip or None)
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
            _lf_request(ip_addr, port, _LF_INVAL, self.name)
        except (OSError, ValueError) as e:
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
        # Both become parts of a key: never a "/" or a "..".
        return "%s/%s" % (_valid_name(name), _valid_label(label))

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
