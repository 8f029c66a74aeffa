"""The public API's listening socket, bound here so its connections get the send buffer the settings give.

Connections accepted on a Linux listener inherit its SO_SNDBUF. Left at 0, the kernel sizes each
connection's send buffer itself and may grow it to net.ipv4.tcp_wmem's maximum (megabytes) for a client
that stops reading; a fixed size bounds what the kernel holds for one such client, on top of the SSE
stream's own buffer (stream_buffer_bytes) and the server's write buffer.
"""

from __future__ import annotations

import socket


def bind_listener(host: str, port: int, send_buffer_bytes: int = 0) -> socket.socket:
    """A bound, listening TCP socket on host:port; SO_SNDBUF set when send_buffer_bytes is positive."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
