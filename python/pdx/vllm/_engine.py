"""One vLLM engine rank's pdx connector: the C connector (pdx.KVConnector)
over vLLM's KV cache tensors, its side channel (a TCP port that hands this
agent's metadata blob to a peer that must connect to it), the peers it
connected, and the block hashes of requests.

The worker side makes it in register_kv_caches; the scheduler side of the
same engine finds it in this process's registry (vLLM runs an engine's
scheduler and its one worker in one process when the engine is one GPU,
the uni executor: tensor_parallel_size 1, as PdxConnector requires).
Every pdx call is thread-safe; the Python state here is guarded by one
lock."""
import json
import logging
import re
import socket
import struct
import threading
import time

import pdx

from . import _settings

log = logging.getLogger("vllm.distributed.kv_transfer.pdx")

_REGISTRY = {}
_REGISTRY_LOCK = threading.Lock()

# The side channel's request and the largest blob it takes back.
_ASK = b"PDXBLOB1\n"
_BLOB_MAX = 64 << 20

# pdx's invariant names, in vLLM's words.
_FIELDS = {
    "hash_algo": "prefix_caching_hash_algo",
    "none_hash": "hash seed (PYTHONHASHSEED: NONE_HASH differs)",
    "block_size": "block_size",
    "kv_dtype": "cache_dtype",
    "layout_fingerprint": "KV layout (layer count, kinds or bytes per "
                          "token differ)",
    "model_id": "model",
    "connector_version": "pdx connector version",
    "kv_layout": "KV cache layout (NHD/HND)",
}


def registry_key(s):
    return (s["engine_id"], s["dp_rank"])


def find(s, timeout=0.0):
    """The engine of these settings in this process, or None."""
    deadline = time.monotonic() + timeout
    while True:
        with _REGISTRY_LOCK:
            e = _REGISTRY.get(registry_key(s))
        if e is not None or time.monotonic() >= deadline:
            return e
        time.sleep(0.01)


def explain_mismatch(err):
    """A pdx.Mismatch's text with the field in vLLM's words."""
    text = str(err)
    m = re.search(r"peer (\S+): (\S+) mismatch: local (.*?), remote "
                  r"([^;]*)", text)
    if m is None:
        return text
    peer, key, local, remote = m.groups()
    return ("peer %s refused: %s mismatch: this engine has %s, the peer has "
            "%s" % (peer, _FIELDS.get(key, key), local, remote))


def exchange_blobs(addr, mine, timeout):
    """Give this agent's blob to the side channel at `addr` and take its
    agent's: after it both sides have loaded each other (a prefill node
    writes to a decode node that asked it for a push; a node reads the
    pool of a node whose handoff it was given)."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)),
                                  timeout=timeout) as sk:
        sk.sendall(_ASK + struct.pack(">Q", len(mine)) + mine)
        return _recv_blob(sk, addr)


def _recv_blob(sk, who):
    n = struct.unpack(">Q", _recv(sk, 8))[0]
    if n > _BLOB_MAX:
        raise pdx.Corrupt("side channel %s: a %d-byte blob" % (who, n))
    return _recv(sk, n)


def _recv(sk, n):
    out = bytearray()
    while len(out) < n:
        chunk = sk.recv(n - len(out))
        if not chunk:
            raise ConnectionError("side channel closed early")
        out += chunk
    return bytes(out)


class _SideChannel:
    """Takes a peer's blob and hands back this agent's (the blobs carry no
    secret: metadata, signed when a cluster key is set; the peer's is
    loaded by pdx, which refuses one with other invariants)."""

    def __init__(self, describe, accept, host, port):
        self._describe = describe
        self._accept = accept
        self._sk = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sk.bind((host, port))
        self._sk.listen(64)
        self._sk.settimeout(0.5)
        self.addr = "%s:%d" % (host, self._sk.getsockname()[1])
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._serve, daemon=True,
                                   name="pdx-side-channel")
        self._t.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                c, _ = self._sk.accept()
            except (socket.timeout, OSError):
                continue
            try:
                c.settimeout(5.0)
                if _recv(c, len(_ASK)) == _ASK:
                    self._accept(_recv_blob(c, "client"))
                    blob = self._describe()
                    c.sendall(struct.pack(">Q", len(blob)) + blob)
            except Exception as e:  # noqa: BLE001 - a bad client only
                log.debug("pdx side channel: %s", e)
            finally:
                c.close()

    def close(self):
        self._stop.set()
        self._t.join(timeout=2.0)
        self._sk.close()


class Engine:
    def __init__(self, s, kv_caches, num_blocks=None):
        self.s = s
        extra = s["extra"]
        arenas, self.layer_of_name = _settings.arenas_of(
            kv_caches, s["block_size"], num_blocks, s["num_hidden_layers"])
        self._tensors = dict(kv_caches)  # keep the memory alive
        self.layout = pdx.Layout(s["block_size"])
        for a in arenas:
            self.layout.add_arena(**a)
        self.layers = sorted({a["layer"] for a in arenas})
        self.names_of_layer = {}
        for name, layer in self.layer_of_name.items():
            self.names_of_layer.setdefault(layer, set()).add(name)
        bpt = sum(a["bytes_per_token"] for a in arenas)
        cfg = _settings.pdx_config(s, bpt, self.layout.num_blocks,
                                   arenas[0]["mem_type"],
                                   arenas[0]["device"])
        self.config_json = json.dumps(cfg, indent=1)
        self.config = pdx.KVConfig.parse(self.config_json,
                                         name="pdx.vllm:" + cfg["agent"]
                                         ["name"])
        self.conn = pdx.KVConnector(self.config, self.layout)
        self.name = self.conn.name
        self.conn.set_invariant("kv_layout", s["kv_layout"])
        self.hasher = self.conn.hasher()
        self.children = [c["type"] for c in cfg["connector"]["children"]]
        self.offload = "offload" in self.children and next(
            c for c in cfg["connector"]["children"]
            if c["type"] == "offload").get("mode", "read_write") != \
            "load_only"
        self.remote = "remote" in self.children
        self._lock = threading.RLock()
        self._peers = {}     # agent name -> side channel it came from
        self._refused = {}   # agent name -> why
        # agent name -> when to try again: a peer whose side channel could
        # not be reached is not tried again, for every request of every
        # step, each a stall of up to rpc_timeout in the scheduler.
        self._unreachable = {}
        self.rpc_timeout = float(extra.get("rpc_timeout", 5.0))
        self.retry_unreachable = float(extra.get("retry_unreachable", 30.0))
        host = extra.get("side_channel_host") or "127.0.0.1"
        port = int(extra.get("side_channel_port", 0)) + (
            s["dp_rank"] if extra.get("side_channel_port") else 0)
        self.side = _SideChannel(self.conn.describe, self._accept, host,
                                 port)
        # Counts since vLLM last took them (stats), and since the start.
        self.stats = dict.fromkeys(
            ("loads", "load_failures", "tokens_loaded", "pushes_asked",
             "saves", "layer_saves", "peers_refused", "peers_unreachable",
             "freed_done", "freed_reject", "freed_expired",
             "freed_peer_gone"), 0)
        self.totals = dict(self.stats)
        with _REGISTRY_LOCK:
            _REGISTRY[registry_key(s)] = self
        log.info("pdx.vllm: agent %s (%d arenas, %d layers, %d blocks, "
                 "children %s) on side channel %s", self.name,
                 self.layout.num_arenas, len(self.layers),
                 self.layout.num_blocks, "+".join(self.children),
                 self.side.addr)

    def count(self, key, n=1):
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + n
            self.totals[key] = self.totals.get(key, 0) + n

    def take_stats(self):
        with self._lock:
            out = dict(self.stats)
            for k in self.stats:
                self.stats[k] = 0
        return out

    # ------------------------------------------------------------- peers
    def ensure_peer(self, agent, addr):
        """Connect `agent` (its blob from side channel `addr`) once. False,
        logged with the field in vLLM's words, when it is refused or
        unreachable."""
        with self._lock:
            if agent in self._peers:
                return True
            if agent in self._refused:
                return False
            if time.monotonic() < self._unreachable.get(agent, 0.0):
                return False
        if not addr:
            log.error("pdx.vllm: no side channel for peer %s in the "
                      "kv_transfer_params", agent)
            return False
        try:
            blob = exchange_blobs(addr, self.conn.describe(),
                                  self.rpc_timeout)
        except (OSError, pdx.Error) as e:
            log.error("pdx.vllm: peer %s at %s: %s (not tried again for "
                      "%.0f s)", agent, addr, e, self.retry_unreachable)
            with self._lock:
                self._unreachable[agent] = time.monotonic() + \
                    self.retry_unreachable
            self.count("peers_unreachable")
            return False
        name = self._accept(blob, addr)
        if name is not None and name != agent:
            log.error("pdx.vllm: side channel %s serves %s, not %s", addr,
                      name, agent)
            return False
        return name is not None

    def _accept(self, blob, addr="side channel"):
        """Load a peer's blob; its name, or None (logged) when refused."""
        try:
            name = self.conn.connect(blob)
        except pdx.Mismatch as e:
            why = explain_mismatch(e)
            log.error("pdx.vllm: %s", why)
            m = re.search(r"peer (\S+):", str(e))
            with self._lock:
                self._refused[m.group(1) if m else addr] = why
            self.count("peers_refused")
            return None
        except pdx.Error as e:
            log.error("pdx.vllm: a peer's blob from %s: %s", addr, e)
            return None
        with self._lock:
            self._peers[name] = addr
        return name

    def refused(self, agent):
        with self._lock:
            return self._refused.get(agent)

    # ------------------------------------------------------------ hashing
    def hash_request(self, tokens, lora_name=None, cache_salt=None):
        """pdx's block hashes (bit-compatible with vLLM's) of `tokens`: the
        full blocks and the partial tail's key (None when none)."""
        kw = {}
        if lora_name is not None:
            kw["lora_name"] = lora_name
        if cache_salt:
            kw["cache_salt"] = cache_salt
        return self.hasher.hash_blocks(list(tokens), tail=True, **kw)

    # -------------------------------------------------------- C connector
    def lookup(self, req):
        return self.conn.lookup(req)

    def request_finished(self, req, block_ids, tokens, source):
        return self.conn.request_finished(req, block_ids, tokens, source)

    def close(self):
        with _REGISTRY_LOCK:
            if _REGISTRY.get(registry_key(self.s)) is self:
                del _REGISTRY[registry_key(self.s)]
        self.side.close()
        self.conn.close()
