"""The listening socket of `ninfer serve`, bound before the model loads.

Binding first turns a busy port or an unresolvable `--host` into a one-line error in a second
instead of a traceback after a minute of loading; the bound socket is then handed to the HTTP
server, so nothing can take the port in between.
"""

from __future__ import annotations

import errno
import socket

from ninfer.cli.errors import UserError

BACKLOG = 100


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: cannot resolve this address ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {_where(host, port)}: {_why(e)}") from None
    sock.set_inheritable(True)
    return sock


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return "the port is already in use (is another server running? pick one with --port)"
    if e.errno == errno.EADDRNOTAVAIL:
        return "this machine has no such address (check --host)"
    if e.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return (e.strerror or str(e)).lower()
