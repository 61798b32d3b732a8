"""systemd's readiness protocol (sd_notify) without libsystemd: one datagram to the
socket named in $NOTIFY_SOCKET.  A no-op outside systemd."""
from __future__ import annotations

import os
import socket


def sd_notify(state: str) -> bool:
    """Send e.g. "READY=1" or "STOPPING=1"; True if a notify socket took it."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or not addr.startswith(("/", "@")):
        return False
    if addr.startswith("@"):                  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
        return True
    except OSError:
        return False
