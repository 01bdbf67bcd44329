"""pdx.nixl: descriptor lists (nixl_xfer_dlist, nixl_reg_dlist,
nixl_remote_dlist), their checked byte format, and what a region argument
can be (tensor, buffer, N x 3 array), and NIXL 1.5's strided rows.

numpy is optional: without it (a plain venv) a list's rows are an
array.array of 3N uint64 words and descriptors come as tuples; an N x 3 or
N x 5 array argument means numpy is there, and is used as before."""

import array
import struct
import sys

try:
    import numpy as np
except ImportError:
    np = None

import pdx as _pdx
from ._common import (  # noqa: F401
    DRAM_SEG,
    VRAM_SEG,
    _SEG_NAME,
    _name,
)


_SER_MAGIC = b"PDXNIXLD"
_SER_VERSION = 1
_SER_XFER, _SER_REG = 1, 2
_SER_MT = {"DRAM": 0, "VRAM": 1}
_SER_MT_NAME = {v: k for k, v in _SER_MT.items()}
_SER_MAX_DESCS = 1 << 26
_SER_HDR = struct.Struct("<8sHBBQ")


def _rows_array(rows):
    """An N x 3 C-contiguous uint64 array from tuples or an array of
    integers (without numpy: an array.array of 3N words): floats (which a
    cast would truncate: 1.9 became 1), negative numbers and non-numbers
    are refused, naming the first bad row."""
    ints = (int,) if np is None else (int, np.integer)
    if np is None or not isinstance(rows, np.ndarray):
        rows = list(rows)
        for i, r in enumerate(rows):
            try:
                ok = len(r) == 3 and all(
                    isinstance(v, ints) and
                    not isinstance(v, bool) and v >= 0 for v in r)
            except TypeError:
                ok = False
            if not ok:
                raise _pdx.InvalidArgument(
                    "descriptor %d %r: (addr, len, device) of non-negative "
                    "integers expected" % (i, r))
    elif rows.size and (rows.dtype.kind not in "iu" or
                        (rows.dtype.kind == "i" and (rows < 0).any())):
        bad = rows.dtype.kind not in "iu"
        raise _pdx.InvalidArgument(
            "descriptors: an array of %s (addr, len, device) %s: integers "
            "expected" % (rows.dtype, "rows" if bad else
                          "rows with a negative value"))
    if np is None:
        return _rows_words(rows)
    a = np.ascontiguousarray(np.asarray(rows, dtype=np.uint64))
    if a.size == 0:
        return np.zeros((0, 3), np.uint64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise _pdx.InvalidArgument(
            "descriptors: (addr, len, device) rows expected, got shape %r"
            % (a.shape,))
    return a


def _rows_words(rows):
    """Without numpy: rows (addr, len, device) as an array.array('Q')."""
    out = array.array("Q")
    for r in rows:
        r = tuple(r)
        if len(r) != 3:
            raise _pdx.InvalidArgument(
                "descriptors: (addr, len, device) rows expected, got %r"
                % (r,))
        try:
            out.extend(int(v) for v in r)
        except OverflowError:
            raise _pdx.InvalidArgument(
                "descriptors: fields must be in 0..2**64-1, got %r" % (r,))
    return out


def _rows_count(rows):
    return int(rows.shape[0]) if np is not None else len(rows) // 3


def _rows_get(rows, i):
    if np is not None:
        r = rows[i]
        return (int(r[0]), int(r[1]), int(r[2]))
    n = len(rows) // 3
    i = int(i)
    if i < 0:
        i += n
    if not 0 <= i < n:
        raise IndexError("descriptor index out of range")
    return tuple(rows[3 * i:3 * i + 3])


def _rows_empty():
    return np.zeros((0, 3), np.uint64) if np is not None else \
        array.array("Q")


def _rows_le_bytes(rows):
    """Rows as little-endian uint64 words (the serialized form)."""
    if np is not None:
        return np.asarray(rows, dtype="<u8").reshape(-1, 3).tobytes() \
            if len(rows) else b""
    a = rows if isinstance(rows, array.array) else _rows_words(rows)
    if sys.byteorder != "little":
        a = array.array("Q", a)
        a.byteswap()
    return a.tobytes()


def _rows_from_le_bytes(data, n, off):
    """n rows of little-endian words at data[off:] as tuples."""
    a = array.array("Q")
    a.frombytes(bytes(data[off:off + 24 * n]))
    if sys.byteorder != "little":
        a.byteswap()
    return [tuple(a[3 * i:3 * i + 3]) for i in range(n)]


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
            rows = self._rows if np is not None else list(self)
            self._dl = _pdx.DescList(rows, self.mem_type)
        return self._dl

    def descCount(self):
        return _rows_count(self._rows)

    def isEmpty(self):
        return _rows_count(self._rows) == 0

    def getType(self):
        """NIXL's segment constant (DRAM_SEG, VRAM_SEG)."""
        return _SEG_OF[self.mem_type]

    def addDesc(self, desc):
        if np is None:
            self._rows.extend(_rows_words([tuple(desc[:3])]))
        else:
            self._rows = np.vstack([self._rows,
                                    _rows_array([tuple(desc[:3])])])
        self._dl = None

    def remDesc(self, index):
        if np is None:
            i = _rows_count(self._rows)
            i = int(index) + i if int(index) < 0 else int(index)
            _rows_get(self._rows, i)  # IndexError when out of range
            del self._rows[3 * i:3 * i + 3]
        else:
            self._rows = np.delete(self._rows, int(index), axis=0)
        self._dl = None

    def clear(self):
        self._rows = _rows_empty()
        self._dl = None

    def print(self):
        print(repr(self), list(self))

    def __getstate__(self):
        return {"mem_type": self.mem_type,
                "rows": self._rows if np is not None else list(self)}

    def __setstate__(self, st):
        self.mem_type = st["mem_type"]
        self._rows = _rows_array(st["rows"])
        self._dl = None

    def __len__(self):
        return _rows_count(self._rows)

    def __getitem__(self, i):
        return _rows_get(self._rows, i)

    def __iter__(self):
        if np is None:
            r = self._rows
            for i in range(0, len(r), 3):
                yield (r[i], r[i + 1], r[i + 2])
            return
        for r in self._rows:
            yield (int(r[0]), int(r[1]), int(r[2]))

    def __eq__(self, other):
        if not (isinstance(other, nixl_xfer_dlist) and
                self.mem_type == other.mem_type):
            return False
        if np is None:
            return self._rows == other._rows
        return np.array_equal(self._rows, other._rows)

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
_SEG_OF = {v: k for k, v in _SEG_NAME.items()}


def serialize_descs(descs):
    """Bytes for a nixl_xfer_dlist or nixl_reg_dlist (pdx's own format:
    header, rows as little-endian uint64, metas; no pickle, so bytes from a
    peer can be rebuilt safely with deserialize_descs)."""
    if isinstance(descs, _pdx.DescList):
        descs = nixl_xfer_dlist(descs.mem_type, [tuple(d) for d in descs])
    if isinstance(descs, nixl_xfer_dlist):
        return _SER_HDR.pack(_SER_MAGIC, _SER_VERSION, _SER_XFER,
                             _SER_MT[descs.mem_type], len(descs)) + \
            _rows_le_bytes(descs._rows)
    if isinstance(descs, nixl_reg_dlist):
        rows = _rows_le_bytes([tuple(r[:3]) for r in descs.regions])
        metas = []
        for r in descs.regions:
            m = r[3] if len(r) > 3 else ""
            m = m.encode() if isinstance(m, str) else bytes(m)
            metas.append(struct.pack("<I", len(m)) + m)
        return _SER_HDR.pack(_SER_MAGIC, _SER_VERSION, _SER_REG,
                             _SER_MT[descs.mem_type], len(descs)) + \
            rows + b"".join(metas)
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
    if kind == _SER_XFER:
        if len(data) != end:
            raise bad("deserialize_descs: %d bytes after the descriptors"
                      % (len(data) - end))
        if np is not None:
            rows = np.frombuffer(data, "<u8", 3 * n, off).reshape(n, 3)
            return nixl_xfer_dlist(_SER_MT_NAME[mt], rows.astype(np.uint64))
        return nixl_xfer_dlist(_SER_MT_NAME[mt],
                               _rows_from_le_bytes(data, n, off))
    rows = _rows_from_le_bytes(data, n, off)
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


# -- NIXL 1.5's strided rows (prep_xfer_dlist) -------------------------------
# A row (addr, len, devId, stride, count) is `count` blocks of `len` bytes
# whose starts are `stride` bytes apart (stride == len: dense). NIXL keeps
# the runs compressed; pdx lists the blocks (a prepared list merges
# contiguous runs when a request is made), indexed as NIXL indexes its
# handle: by flattened block index, run by run. At most _STRIDE_MAX_BLOCKS
# blocks in one list.
_STRIDE_MAX_BLOCKS = _SER_MAX_DESCS


def _is_strided(o):
    """An N x 5 array, or a non-empty list of 5-tuples."""
    if np is not None and isinstance(o, np.ndarray):
        return o.ndim == 2 and o.shape[1] == 5
    return isinstance(o, (list, tuple)) and len(o) > 0 and \
        all(isinstance(r, (tuple, list)) and len(r) == 5 for r in o)


def _check_stride_run(i, a, n, d, st, c):
    bad = _pdx.InvalidArgument
    if c == 0 or n == 0 or st < n:
        raise bad("prep_xfer_dlist: strided row %d (addr 0x%x, len %d, "
                  "stride %d, count %d): count and len must be > 0 and "
                  "stride >= len" % (i, a, n, st, c))
    if a + (c - 1) * st + n > 1 << 64 or d >> 32:
        raise bad("prep_xfer_dlist: strided row %d: its last block ends past "
                  "2**64, or device %d above 2**32-1" % (i, d))


def strided_dlist(mem_type, rows):
    """The nixl_xfer_dlist of every block of strided rows (an N x 5 uint64
    or int64 C-contiguous array, as NIXL 1.5 takes, or 5-tuples). Bad rows
    raise nixlInvalidParamError naming the row; a wrong array ValueError,
    as NIXL's binding."""
    if np is not None and isinstance(rows, np.ndarray):
        if rows.dtype not in (np.dtype(np.uint64), np.dtype(np.int64)):
            raise ValueError("descs must be a Nx5 numpy array of uint64 or "
                             "int64")
        if not rows.flags.c_contiguous:
            raise ValueError("descs must be a C-contiguous numpy array")
        if rows.shape[0] == 0:
            raise _pdx.InvalidArgument("prep_xfer_dlist: no strided rows")
        r = rows.astype(np.uint64, copy=False)
        if rows.dtype == np.int64 and (rows < 0).any():
            raise _pdx.InvalidArgument("prep_xfer_dlist: strided rows with "
                                       "negative fields")
        total = 0
        for i, row in enumerate(r.tolist()):
            _check_stride_run(i, *row)
            total += row[4]
        if total > _STRIDE_MAX_BLOCKS:
            raise _pdx.InvalidArgument(
                "prep_xfer_dlist: strided rows describe %d blocks, at most "
                "%d" % (total, _STRIDE_MAX_BLOCKS))
        count = r[:, 4].astype(np.int64)  # each <= total: fits
        run = np.repeat(np.arange(r.shape[0]), count)
        first = np.repeat(np.cumsum(count) - count, count)
        k = np.arange(total, dtype=np.uint64) - first.astype(np.uint64)
        out = np.empty((total, 3), np.uint64)
        out[:, 0] = r[run, 0] + k * r[run, 3]
        out[:, 1] = r[run, 1]
        out[:, 2] = r[run, 2]
        return nixl_xfer_dlist(mem_type, out)
    out, total = [], 0
    for i, row in enumerate(rows):
        a, n, d, st, c = (int(v) for v in row)
        if min(a, n, d, st, c) < 0:
            raise _pdx.InvalidArgument("prep_xfer_dlist: strided row %d "
                                       "has a negative field" % i)
        _check_stride_run(i, a, n, d, st, c)
        total += c
        if total > _STRIDE_MAX_BLOCKS:
            raise _pdx.InvalidArgument(
                "prep_xfer_dlist: strided rows describe more than %d "
                "blocks" % _STRIDE_MAX_BLOCKS)
        out.extend((a + k * st, n, d) for k in range(c))
    return nixl_xfer_dlist(mem_type, out)


def _is_tensorlike(o):
    return (hasattr(o, "data_ptr") and callable(o.data_ptr)) or \
        hasattr(o, "__cuda_array_interface__")


def _non_contiguous(o):
    f = getattr(o, "is_contiguous", None)
    if callable(f):
        return not f()
    if np is not None and isinstance(o, np.ndarray):
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
    return np is not None and isinstance(o, np.ndarray) and o.ndim == 2 \
        and o.shape[1] == 3
