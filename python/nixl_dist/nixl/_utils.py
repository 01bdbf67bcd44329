"""nixl._utils on pdx: the memory helpers NIXL's tests and examples use
(malloc_passthru, free_passthru, ba_buf, verify_transfer), with libc
through ctypes. Addresses are ints; sizes must be >= 0. verify_transfer
raises AssertionError naming the first differing offset (NIXL's C
assert aborts the process instead)."""
import ctypes as _ct

_libc = _ct.CDLL(None, use_errno=True)
_libc.aligned_alloc.restype = _ct.c_void_p
_libc.aligned_alloc.argtypes = [_ct.c_size_t, _ct.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [_ct.c_void_p]
_libc.memset.restype = _ct.c_void_p
_libc.memset.argtypes = [_ct.c_void_p, _ct.c_int, _ct.c_size_t]
_libc.memcmp.restype = _ct.c_int
_libc.memcmp.argtypes = [_ct.c_void_p, _ct.c_void_p, _ct.c_size_t]

IO_SIZE = 4096


def _size(size):
    size = int(size)
    if size < 0:
        raise ValueError("size %d: must be >= 0" % size)
    return size


def malloc_passthru(size):
    """A 4096-byte aligned buffer of `size` bytes (rounded up to 4096, as
    aligned_alloc requires); its address as an int (0 if out of memory)."""
    size = _size(size)
    rounded = max(IO_SIZE, (size + IO_SIZE - 1) // IO_SIZE * IO_SIZE)
    return _libc.aligned_alloc(IO_SIZE, rounded) or 0


def free_passthru(addr):
    """Frees a malloc_passthru buffer (0 is ignored)."""
    _libc.free(int(addr) or None)


def ba_buf(addr, size):
    """Fills `size` bytes at `addr` with 0xba."""
    _libc.memset(int(addr), 0xba, _size(size))


def verify_transfer(addr1, addr2, size):
    """Asserts `size` bytes at addr1 and addr2 are equal."""
    size = _size(size)
    if size == 0 or _libc.memcmp(int(addr1), int(addr2), size) == 0:
        return
    a = _ct.string_at(int(addr1), size)
    b = _ct.string_at(int(addr2), size)
    i = next(k for k in range(size) if a[k] != b[k])
    raise AssertionError("verify_transfer: byte %d differs (0x%02x != 0x%02x)"
                         % (i, a[i], b[i]))
