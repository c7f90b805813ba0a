"""Bytes of a response not yet on the wire: the sign of a client that stopped reading (its TCP
window closed). The transport's buffer plus, on Linux, the socket's unsent queue (SIOCOUTQNSD),
which, unlike unacknowledged bytes, never lingers behind a reading client's delayed ACK.
"""

from __future__ import annotations

import fcntl
import struct
import sys
from typing import Any

SIOCOUTQNSD = 0x894B  # linux/sockios.h: bytes in the send queue not yet sent


def unsent_bytes(transport: Any) -> int:
    """Bytes written to `transport` that have not been put on the wire."""
    pending = transport.get_write_buffer_size()
    get_extra = getattr(transport, "get_extra_info", None)
    sock = get_extra("socket") if get_extra is not None else None
    if sock is None or not sys.platform.startswith("linux"):
        return pending
    try:
        queued = fcntl.ioctl(sock.fileno(), SIOCOUTQNSD, b"\0\0\0\0")
    except (OSError, ValueError):  # not a TCP socket, or already closed
        return pending
    return pending + struct.unpack("i", queued)[0]
