"""pdx.nixl: NIXL's "POSIX" plugin in Python: READ/WRITE between the
host memory of registered regions and registered FILE regions
(descriptors (offset, len, fd, meta)), with os.preadv/os.pwritev on the
registered fds, run on worker threads so that transfer() returns "PROC"
at once; check_xfer_state gives "PROC" then "DONE" or raises the NIXL
error class. Transfers are local (the remote agent is the agent's own
name, as NIXL's storage backends)."""

import concurrent.futures
import ctypes
import errno
import os
import threading
import time

import pdx as _pdx

from ._common import (
    nixlBackendError,
    nixlInvalidParamError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRepostActiveError,
)

_O_DIRECT = getattr(os, "O_DIRECT", 0)


class _FileRegs:
    """The FILE regions an agent registered (refcounted, as memory) and
    the worker threads that move their bytes."""

    def __init__(self):
        self.regs = {}  # (offset, len, fd) -> [meta, refcount]
        self._pool = None
        self._lock = threading.Lock()

    def add(self, regions):
        for off, length, fd, meta in regions:
            if length <= 0 or off < 0 or fd < 0:
                raise nixlInvalidParamError(
                    "register_memory FILE (%d, %d, %d): a file region needs "
                    "offset >= 0, len > 0 and an open fd" % (off, length, fd))
            try:
                os.fstat(fd)
            except OSError as e:
                raise nixlInvalidParamError(
                    "register_memory FILE: fd %d: %s" % (fd, e.strerror))
        for off, length, fd, meta in regions:
            ent = self.regs.get((off, length, fd))
            if ent is None:
                self.regs[(off, length, fd)] = [meta, 1]
            else:
                ent[1] += 1

    def drop(self, regions):
        for off, length, fd, _ in regions:
            ent = self.regs.get((off, length, fd))
            if ent is None:
                continue
            ent[1] -= 1
            if ent[1] <= 0:
                del self.regs[(off, length, fd)]

    def covers(self, off, length, fd):
        return any(k[2] == fd and k[0] <= off and off + length <= k[0] + k[1]
                   for k in self.regs)

    def pool(self):
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=4, thread_name_prefix="pdx-nixl-posix")
            return self._pool

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.regs.clear()


def _accmode(fd):
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE


def _is_direct(fd):
    if not _O_DIRECT:
        return False
    import fcntl
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & _O_DIRECT)
    except OSError:
        return False


class _PosixXfer:
    """A file request: the interface of the pdx.Xfer that nixl_xfer_handle
    wraps (post, check, release, telemetry, segments, status, error)."""

    def __init__(self, files, operation, mem_rows, file_rows, notif):
        self._files = files
        self.operation = operation
        self._pairs = list(zip(mem_rows, file_rows))
        self.segments = len(self._pairs)
        self.notif = notif
        self._fut = None
        self._released = False
        self._cancel = False
        self.error = None
        self._start_ns = 0
        self._post_ns = 0
        self._xfer_ns = 0
        self._posts = 0
        self._bytes = sum(m[1] for m, _ in self._pairs)

    def _live(self):
        if self._released:
            raise _pdx.Closed("the transfer handle was released")

    def post(self):
        self._live()
        if self._fut is not None and not self._fut.done():
            raise nixlRepostActiveError(
                "transfer: the file request is still in flight; repost it "
                "once check_xfer_state says DONE")
        t0 = time.monotonic_ns()
        self._start_ns = time.time_ns()
        self.error = None
        self._fut = self._files.pool().submit(self._run)
        self._post_ns = time.monotonic_ns() - t0
        self._posts += 1
        return False  # NIXL's POSIX: in progress once posted

    def _run(self):
        t0 = time.monotonic_ns()
        # Buffered twins of O_DIRECT fds, opened for this run only (an fd
        # number may name another file by the next one).
        self._twins = {}
        try:
            for (addr, length, _), (off, flen, fd) in self._pairs:
                if self._cancel:
                    return
                try:
                    self._move(addr, length, off, fd)
                except OSError as e:
                    self.error = "POSIX %s of %d bytes at offset %d of fd " \
                        "%d: %s" % (self.operation, length, off, fd, e)
                    raise nixlBackendError(self.error) from None
        except nixlBackendError as e:
            self.error = str(e)
            raise
        finally:
            for t in self._twins.values():
                os.close(t)
            self._twins = {}
            self._xfer_ns = time.monotonic_ns() - t0

    def _move(self, addr, length, off, fd):
        mv = memoryview((ctypes.c_char * length).from_address(addr)).cast("B")
        done = 0
        use = fd
        while done < length:
            part = mv[done:]
            try:
                if self.operation == "WRITE":
                    n = os.pwritev(use, [part], off + done)
                else:
                    n = os.preadv(use, [part], off + done)
            except OSError as e:
                if e.errno == errno.EINVAL and use == fd and _is_direct(fd):
                    # O_DIRECT wants aligned buffers, offsets and lengths:
                    # the same file through a buffered twin.
                    use = self._twins.get(fd)
                    if use is None:
                        use = self._twins[fd] = os.open(
                            "/proc/self/fd/%d" % fd,
                            _accmode(fd) | os.O_CLOEXEC)
                    continue
                raise
            if n == 0:
                raise nixlBackendError(
                    "POSIX READ: end of file at offset %d of fd %d (%d of %d "
                    "bytes read)" % (off + done, fd, done, length))
            done += n

    def check(self):
        self._live()
        if self._fut is None:
            return False
        if not self._fut.done():
            return False
        exc = self._fut.exception()
        if exc is not None:
            raise exc
        return True

    @property
    def status(self):
        if self._fut is None or not self._fut.done():
            return 1
        return 0 if self._fut.exception() is None else -1

    def telemetry(self):
        self._live()
        return {"start_time_ns": self._start_ns,
                "post_duration_ns": self._post_ns,
                "xfer_duration_ns": self._xfer_ns,
                "bytes": self._bytes, "descs": self.segments,
                "backend": "POSIX", "transport": "", "fallback": False,
                "fallback_why": "", "posts": self._posts}

    def release(self):
        if self._released:
            return
        # The memory may go once released: stop between descriptors and
        # wait for the one being moved.
        self._cancel = True
        if self._fut is not None:
            concurrent.futures.wait([self._fut])
        self._released = True

    def __repr__(self):
        return "_PosixXfer(%s, %d descs)" % (self.operation, self.segments)


class FileDlist:
    """A prepared FILE list (prep_xfer_dlist(own name, FILE descs)): its
    rows, for make_prepped_xfer."""

    def __init__(self, nagent, descs):
        for i, (off, n, fd) in enumerate(descs):
            if not nagent._files.covers(off, n, fd):
                raise nixlNotFoundError(
                    "prep_xfer_dlist: FILE descriptor %d (offset %d, %d "
                    "bytes, fd %d) is not inside a registered FILE region"
                    % (i, off, n, fd))
        self.mem_type = "FILE"
        self.rows = list(descs)
        self.valid = True

    def release(self):
        self.valid = False

    def pick(self, indices, what):
        if not self.valid:
            raise nixlInvalidParamError("make_prepped_xfer: the %s list was "
                                        "released" % what)
        out = []
        for i in indices:
            i = int(i)
            if not 0 <= i < len(self.rows):
                raise nixlInvalidParamError(
                    "make_prepped_xfer: %s index %d of %d descriptors"
                    % (what, i, len(self.rows)))
            out.append(self.rows[i])
        return out

    def __len__(self):
        return len(self.rows)

    def __repr__(self):
        return "FileDlist(%d descs)" % len(self.rows)


def make_file_xfer(nagent, operation, local, remote, peer, notif):
    """initialize_xfer with a FILE side: checks the lists as NIXL's agent
    does and returns the request (not posted)."""
    if peer != nagent.name:
        raise nixlNotSupportedError(
            "initialize_xfer: FILE descriptors are moved by this agent's "
            "POSIX plugin; the remote agent must be the agent's own name "
            "(%r), not %r" % (nagent.name, peer))
    if not any(b.upper() == "POSIX" for b in nagent.backends):
        raise nixlNotFoundError(
            "initialize_xfer: FILE descriptors need the POSIX backend "
            "(create_backend('POSIX'))")
    if local.mem_type == "FILE":
        raise nixlNotSupportedError(
            "initialize_xfer: the local side is memory and the remote side "
            "FILE (NIXL's storage transfers)")
    if local.mem_type != "DRAM":
        raise nixlNotSupportedError(
            "initialize_xfer: pdx's POSIX plugin moves host memory (DRAM), "
            "not %s" % local.mem_type)
    if len(local) != len(remote):
        raise nixlInvalidParamError(
            "initialize_xfer: %d local and %d FILE descriptors"
            % (len(local), len(remote)))
    if notif:
        # NIXL: NIXL_ERR_BACKEND, the backend does not support them.
        raise nixlBackendError(
            "initialize_xfer: the POSIX backend does not support "
            "notifications")
    mem_rows, file_rows = list(local), list(remote)
    for i, ((addr, length, dev), (off, flen, fd)) in enumerate(
            zip(mem_rows, file_rows)):
        if length != flen:
            raise nixlInvalidParamError(
                "initialize_xfer: descriptor %d: %d bytes of memory, %d of "
                "file" % (i, length, flen))
        if not nagent._files.covers(off, flen, fd):
            raise nixlNotFoundError(
                "initialize_xfer: FILE descriptor %d (offset %d, %d bytes, "
                "fd %d) is not inside a registered FILE region"
                % (i, off, flen, fd))
        if not nagent._mem_covers(local.mem_type, addr, length, dev):
            raise nixlNotFoundError(
                "initialize_xfer: memory descriptor %d (0x%x, %d bytes) is "
                "not inside a registered %s region"
                % (i, addr, length, local.mem_type))
    return _PosixXfer(nagent._files, operation, mem_rows, file_rows, notif)
