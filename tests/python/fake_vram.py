"""GPU memory for the Python tests without a GPU: the CUDA driver named by
PDX_CUDA_DRIVER_LIB (the tests' fake driver, tests/fixtures/fake_cuda.c,
whose device memory is host memory behind memfds) through ctypes, the same
library pdx's backends load. Bytes go in and out only through the driver's
copies (cuMemcpyHtoD, cuMemcpyDtoH), never through the device pointer, so
a check reads what is in "device" memory.

Objects standing for what stacks register: `CudaTensor` quacks like a
torch CUDA tensor (data_ptr, numel, element_size, device.type 'cuda',
device.index, is_contiguous), `CudaArray` exposes
__cuda_array_interface__ (CuPy, Numba)."""
import ctypes
import os

import numpy as np

_c = ctypes


class Driver:
    """The driver, initialised, with each used device's primary context
    current in turn on the calling thread."""

    def __init__(self, path=None):
        path = path or os.environ.get("PDX_CUDA_DRIVER_LIB")
        if not path:
            raise RuntimeError("PDX_CUDA_DRIVER_LIB is not set (the fake "
                               "CUDA driver, libpdx_fake_cuda.so)")
        # The same file pdx's cu_api dlopens: one instance of the driver.
        self.lib = _c.CDLL(path, mode=os.RTLD_NOW)
        self._ctx = {}
        self._check(self.lib.cuInit(0), "cuInit")
        n = _c.c_int()
        self._check(self.lib.cuDeviceGetCount(_c.byref(n)),
                    "cuDeviceGetCount")
        self.count = n.value

    def _check(self, r, what):
        if r != 0:
            raise RuntimeError("cuda: %s: CUresult %d" % (what, r))

    def use(self, dev):
        """Make device `dev`'s primary context current."""
        ctx = self._ctx.get(dev)
        if ctx is None:
            d = _c.c_int()
            self._check(self.lib.cuDeviceGet(_c.byref(d), dev), "cuDeviceGet")
            ctx = _c.c_void_p()
            self._check(self.lib.cuDevicePrimaryCtxRetain(_c.byref(ctx), d),
                        "cuDevicePrimaryCtxRetain")
            self._ctx[dev] = ctx
        self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def alloc(self, nbytes, dev=0):
        self.use(dev)
        p = _c.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(_c.byref(p), _c.c_size_t(nbytes)),
                    "cuMemAlloc(%d)" % nbytes)
        return p.value

    def free(self, addr, dev=0):
        self.use(dev)
        self._check(self.lib.cuMemFree_v2(_c.c_uint64(addr)), "cuMemFree")

    def htod(self, addr, data, dev=0):
        buf = np.ascontiguousarray(np.frombuffer(data, np.uint8)
                                   if not isinstance(data, np.ndarray)
                                   else data.view(np.uint8).reshape(-1))
        self.use(dev)
        self._check(self.lib.cuMemcpyHtoD_v2(
            _c.c_uint64(addr), _c.c_void_p(buf.ctypes.data),
            _c.c_size_t(buf.nbytes)), "cuMemcpyHtoD")

    def dtoh(self, addr, nbytes, dev=0):
        out = np.empty(nbytes, np.uint8)
        self.use(dev)
        self._check(self.lib.cuMemcpyDtoH_v2(
            _c.c_void_p(out.ctypes.data), _c.c_uint64(addr),
            _c.c_size_t(nbytes)), "cuMemcpyDtoH")
        return out


class _Device:
    def __init__(self, index):
        self.type = "cuda"
        self.index = index

    def __repr__(self):
        return "device(type='cuda', index=%d)" % self.index


class Vram:
    """One allocation of device memory: addr, nbytes, dev; write(bytes or
    array[, offset]), read([offset, n]) as a uint8 array, zero(), free()."""

    def __init__(self, drv, nbytes, dev=0):
        self.drv, self.nbytes, self.dev = drv, nbytes, dev
        self.addr = drv.alloc(nbytes, dev)
        self.zero()

    def write(self, data, offset=0):
        n = len(memoryview(data).cast("B")) if not isinstance(
            data, np.ndarray) else data.nbytes
        assert offset + n <= self.nbytes
        self.drv.htod(self.addr + offset, data, self.dev)

    def read(self, offset=0, n=None):
        n = self.nbytes - offset if n is None else n
        assert offset + n <= self.nbytes
        return self.drv.dtoh(self.addr + offset, n, self.dev)

    def zero(self):
        self.write(np.zeros(self.nbytes, np.uint8))

    def free(self):
        if self.addr:
            self.drv.free(self.addr, self.dev)
            self.addr = 0


class CudaTensor(Vram):
    """A contiguous torch CUDA tensor as pdx (python/src/buffer.c) and
    pdx.nixl read one: data_ptr(), numel(), element_size(), .device."""

    def __init__(self, drv, numel, element_size=2, dev=0):
        super().__init__(drv, numel * element_size, dev)
        self._numel, self._esize = numel, element_size
        self.device = _Device(dev)
        self.is_cuda = True

    def data_ptr(self):
        return self.addr

    def numel(self):
        return self._numel

    def element_size(self):
        return self._esize

    def is_contiguous(self):
        return True

    def dim(self):
        return 1


class CudaArray(Vram):
    """A CuPy/Numba array: __cuda_array_interface__ (version 3)."""

    def __init__(self, drv, shape, typestr="<f2", dev=0):
        itemsize = int(typestr[2:])
        super().__init__(drv, int(np.prod(shape)) * itemsize, dev)
        self.device = _Device(dev)
        self.__cuda_array_interface__ = {
            "data": (self.addr, False), "shape": tuple(shape),
            "typestr": typestr, "strides": None, "version": 3}


class Dram:
    """Host memory with Vram's interface: a numpy array, or shared memory
    (pdx.mem_alloc, which a same-host peer's cma maps) with shared=True."""

    def __init__(self, nbytes, shared=False):
        self.nbytes, self.dev = nbytes, 0
        if shared:
            import pdx
            self._mem = pdx.mem_alloc(nbytes)
            self.array = np.frombuffer(self._mem, np.uint8)
        else:
            self._mem = None
            self.array = np.zeros(nbytes, np.uint8)
        self.addr = self.array.ctypes.data

    def write(self, data, offset=0):
        data = np.frombuffer(data, np.uint8) if not isinstance(
            data, np.ndarray) else data.view(np.uint8).reshape(-1)
        self.array[offset:offset + data.nbytes] = data

    def read(self, offset=0, n=None):
        n = self.nbytes - offset if n is None else n
        return self.array[offset:offset + n].copy()

    def zero(self):
        self.array[:] = 0

    def free(self):
        if self._mem is not None:
            self.array = None
            self._mem.close()
            self._mem = None


_DRIVER = []


def driver():
    """This process's Driver (made at the first use)."""
    if not _DRIVER:
        _DRIVER.append(Driver())
    return _DRIVER[0]


def region(mem, nbytes, dev=0, shared=False):
    """`nbytes` of memory of kind `mem` ("DRAM" or "VRAM", on device
    `dev`), zeroed."""
    if mem == "VRAM":
        return Vram(driver(), nbytes, dev)
    assert mem == "DRAM", mem
    return Dram(nbytes, shared)
