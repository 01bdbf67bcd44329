"""pdx: prefill/decode KV exchange from Python.

The native core (``pdx._pdx``) wraps libpdx.so's C API; this module adds
the pure-Python conveniences. Same-host quick start::

    import numpy as np, pdx
    with pdx.Agent("p") as p, pdx.Agent("d") as d:
        src = pdx.mem_alloc(1 << 20); dst = bytearray(1 << 20)
        np.frombuffer(src, np.uint8)[:] = 7
        p.register(src); d.register(dst)
        peer = d.load_peer(p.describe())
        x = d.create_xfer("READ", [(pdx.addr_of(dst), 1 << 20, 0)],
                          [(src.addr, 1 << 20, 0)], peer, notif=b"done")
        x.post(); x.wait(timeout=5); x.release()

Objects that wrap pdx handles (Agent, MemReg, PreparedList, Xfer,
KVConnector, SharedMemory) raise ``pdx.Closed`` when used after close or
release; they never crash. Errors are ``pdx.Error`` subclasses, one per
status, carrying ``pdx_last_error()``'s text.
"""

from . import _pdx
from ._pdx import (  # noqa: F401
    Agent, MemReg, DescList, PreparedList, Xfer, SharedMemory, KVConfig,
    Hasher, Layout as _Layout, KVConnector, mem_alloc, mem_attach,
    mem_info, status_string, last_error, version, set_log_level, blob_describe,
    backend_probe, DRAM, VRAM, READ, WRITE, OK, INPROGRESS, NOTIF_MAX,
    NAME_MAX, HAVE,
    Error, Closed, InvalidArgument, NoMemory, NotFound, Unsupported,
    BackendError, RemoteDisconnect, Stale, Mismatch, Corrupt, VersionError,
    TooLarge, Timeout, Busy, Exists, Unavailable, Canceled, IOFailure,
    ConfigError, NoSpace, PolicyError,
)

__all__ = [
    "Agent", "MemReg", "DescList", "PreparedList", "Xfer", "SharedMemory",
    "KVConfig", "Hasher", "Layout", "KVConnector", "KVRequest", "mem_alloc",
    "mem_attach", "mem_info", "addr_of", "status_string", "last_error", "version",
    "set_log_level", "blob_describe", "backend_probe", "DRAM", "VRAM",
    "READ", "WRITE", "Error", "Closed", "InvalidArgument", "NoMemory",
    "NotFound", "Unsupported", "BackendError", "RemoteDisconnect", "Stale",
    "Mismatch", "Corrupt", "VersionError", "TooLarge", "Timeout", "Busy",
    "Exists", "Unavailable", "Canceled", "IOFailure", "ConfigError",
    "NoSpace", "PolicyError",
]

__version__ = version()


def addr_of(obj):
    """Start address of anything Agent.register takes: a buffer-protocol
    object (bytearray, numpy array, mmap, SharedMemory), a tensor
    (data_ptr()), a CUDA array or an (addr, len, ...) tuple."""
    return mem_info(obj)[0]


class Layout(_Layout):
    """Layout(block_tokens): a model's KV as arenas sharing block ids.
    Adds the constructors from Python data to the native type."""

    @classmethod
    def from_arenas(cls, block_tokens, arenas):
        """A layout from a list of dicts with add_arena's arguments
        (name, layer, kind, bytes_per_token, num_blocks, and optionally
        is_mtp, stride, base, mem_type, device)."""
        lay = cls(block_tokens)
        for a in arenas:
            lay.add_arena(**a)
        return lay

    @classmethod
    def from_tensors(cls, block_tokens, tensors, bytes_per_token, *,
                     names=None, kinds="kv", layers=None):
        """One arena per tensor (or buffer), in order: each holds
        len(tensor) // (bytes_per_token * block_tokens) blocks, packed.
        `bytes_per_token` and `kinds` may be one value or one per tensor;
        names default to 'layer<i>.<kind>'."""
        n = len(tensors)
        bpts = bytes_per_token if isinstance(bytes_per_token, (list, tuple))\
            else [bytes_per_token] * n
        ks = kinds if isinstance(kinds, (list, tuple)) else [kinds] * n
        lays = layers if layers is not None else list(range(n))
        lay = cls(block_tokens)
        for i, t in enumerate(tensors):
            nbytes = _nbytes(t)
            block = bpts[i] * block_tokens
            if nbytes < block:
                raise InvalidArgument(
                    "tensor %d: %d bytes, less than one block (%d)"
                    % (i, nbytes, block))
            name = names[i] if names else "layer%d.%s" % (lays[i], ks[i])
            lay.add_arena(name, lays[i], ks[i], bpts[i], nbytes // block,
                          base=t)
        return lay


def _nbytes(obj):
    return mem_info(obj)[1]


class KVRequest:
    """A request as the connector sees it (any object or dict with these
    fields works too): req_id, hashes (block hashes, bytes), prompt_tokens,
    tail_hash (bytes or None), tail_tokens, params (the peer's handoff
    parameters, a dict)."""

    __slots__ = ("req_id", "hashes", "prompt_tokens", "tail_hash",
                 "tail_tokens", "params")

    def __init__(self, req_id, hashes=(), prompt_tokens=0, tail_hash=None,
                 tail_tokens=0, params=None):
        self.req_id = req_id
        self.hashes = list(hashes)
        self.prompt_tokens = prompt_tokens
        self.tail_hash = tail_hash
        self.tail_tokens = tail_tokens
        self.params = params

    @classmethod
    def from_tokens(cls, req_id, tokens, hasher, params=None, **extra):
        """Hash `tokens` with `hasher` (a pdx.Hasher) into a request: full
        blocks plus the partial tail key when there is one."""
        hashes, tail = hasher.hash_blocks(tokens, tail=True, **extra)
        ntok = len(tokens)
        return cls(req_id, hashes, ntok, tail,
                   ntok % hasher.block_size if tail is not None else 0,
                   params)

    def __repr__(self):
        return "KVRequest(%r, %d blocks%s, %d tokens)" % (
            self.req_id, len(self.hashes),
            " + tail" if self.tail_hash is not None else "",
            self.prompt_tokens)


# SharedMemory pickling (multiprocessing): the receiving process maps the
# same pages through a duplicate of the memfd.
def _shm_reduce(fd, nbytes):
    from multiprocessing import reduction
    return (_shm_rebuild, (reduction.DupFd(fd), nbytes))


def _shm_rebuild(dupfd, nbytes):
    return mem_attach(dupfd.detach(), nbytes)
