"""How much of what was written to a client it has not taken yet, for the write stall bound
(`app.edge.connection`): the transport's own buffer, plus the socket's send queue in the kernel
(Linux's `SIOCOUTQ`, `TIOCOUTQ` in `termios`: bytes the client has not acknowledged).

The kernel's part matters: its send buffer grows to megabytes (`tcp_wmem`), so a slow client
reading a large answer drains it for minutes before the transport's buffer moves at all; measured
by the transport's buffer alone, it looked like a client that had stopped reading. Where the
query is not available (not Linux, not a socket), the transport's buffer alone is the measure.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios

_OUTQ = getattr(termios, "TIOCOUTQ", None)
_INT = struct.Struct("i")


def unsent(transport: asyncio.WriteTransport) -> int:
    """Bytes written to `transport` that its peer has not taken yet."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if _OUTQ is None or sock is None:
        return size
    try:
        return size + int(_INT.unpack(fcntl.ioctl(sock.fileno(), _OUTQ, bytes(_INT.size)))[0])
    except OSError:
        return size
