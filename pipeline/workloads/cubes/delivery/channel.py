"""The local channel between a consumer and the producers on its host.

One Unix ``SOCK_SEQPACKET`` connection per producer, listening on an *abstract*
address (Linux): the name lives in the kernel, not in the file system, and
disappears with the listening socket, so a killed consumer leaves no file behind.
Messages are small JSON objects, one per packet; a batch buffer travels once, as
a file descriptor in an ``SCM_RIGHTS`` control message.

Batch buffers are ``memfd`` files: anonymous shared memory with no name in
``/dev/shm``. The kernel frees one when the last descriptor and mapping of it
close, which is what makes delivery leave nothing behind whichever side is
killed, even with SIGKILL: nothing needs unlinking, and descriptors still in a
socket's queue are released with the socket.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import secrets
import socket

__all__ = [
    "MEMFD_NAME",
    "Channel",
    "connect",
    "listen",
    "new_buffer",
    "new_address",
]

#: What a batch buffer is called in ``/proc/<pid>/fd`` and ``/proc/<pid>/maps``
#: (``/memfd:pipeline-cubes (deleted)``), which is how tests find leaks.
MEMFD_NAME = "pipeline-cubes"
_MAX_PACKET = 1 << 16
_FLAGS = mmap.MAP_SHARED | mmap.MAP_POPULATE


def new_address() -> str:
    """A fresh abstract socket name; it carries the consumer's pid for ``ss -x``."""
    return f"\0pipeline-cubes-{os.getpid()}-{secrets.token_hex(8)}"


def listen(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(address)
    sock.listen(64)
    return sock


def connect(address: str, timeout: float = 5.0) -> socket.socket:
    """Connect to a consumer; ``OSError`` when it is on another host (or network
    namespace), where its abstract name does not exist."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def new_buffer(nbytes: int) -> tuple[int, mmap.mmap]:
    """A memfd of ``nbytes`` and a shared mapping of it, populated now (one call
    instead of a page fault per 4 KB page in the first build)."""
    fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        region = mmap.mmap(fd, nbytes, _FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd, region


def map_buffer(fd: int, nbytes: int) -> mmap.mmap:
    """A producer's mapping of a buffer it received, page tables filled now; the
    descriptor is closed (the mapping keeps the memory)."""
    try:
        return mmap.mmap(fd, nbytes, _FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


class Channel:
    """One end of a producer connection: JSON messages, optionally with one fd."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict, fd: int | None = None) -> None:
        data = json.dumps(message).encode()
        if fd is None:
            self.sock.sendall(data)
        else:
            rights = array.array("i", [fd])
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])

    def receive(self) -> tuple[dict | None, int | None]:
        """The next message and the fd it carried; ``(None, None)`` when the other end
        closed (or died)."""
        fds = array.array("i")
        try:
            data, ancdata, _flags, _addr = self.sock.recvmsg(
                _MAX_PACKET, socket.CMSG_SPACE(fds.itemsize)
            )
        except (ConnectionResetError, BrokenPipeError):
            return None, None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        fd = fds[0] if fds else None
        for extra in fds[1:]:
            os.close(extra)
        if not data:
            if fd is not None:
                os.close(fd)
            return None, None
        return json.loads(data), fd

    def close(self) -> None:
        self.sock.close()
