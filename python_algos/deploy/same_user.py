"""Only the deploying user's processes may talk to a local Flower deployment's servers.

Flower 1.41's SuperLink serves its Control API (``flwr run``, ``flwr supernode register``), its
Fleet API (SuperNodes) and its Runtime API (SuperExec, ServerApp) on one HTTP port, and a SuperNode
serves its Runtime API (its ClientApps) on another; without Flower Enterprise none of them asks who
is calling, so any local account that knows the port could start a run (whose ServerApp then runs as
the deploying user) or join a SuperNode. TLS would not change that (a server certificate proves the
server to the client, not the client to the server; Flower's clients present no certificate).

On loopback the kernel knows who is calling: the client's end of the TCP connection is a socket
owned by the uid that made it. Linux answers "which uid owns the socket of this connection" through
its socket-diagnostics netlink (what ``ss`` uses: one exact lookup, about 0.1 ms); where that is not
available, the same is read from ``/proc/net/tcp`` (``tcp6``), a whole-table listing that can take
tens of milliseconds. :class:`SameUserOnly` answers 403 to every request whose client socket is not
an established connection owned by the server's own uid (nor found: the check fails closed).
``python .../deploy/same_user.py flower-superlink|flower-supernode ARGS...`` runs Flower's command
with that check in front of its HTTP app (run as a file: it imports nothing of python_algos).

The other direction: a process of another user could listen first on the port chosen for the
SuperLink, and SuperNodes joining it would run that user's ClientApps as the deploying user.
:func:`listener` names the socket listening on a port (its owner and inode, from the same tables),
so the deployment checks that it is one of its SuperLink's (:func:`socket_inodes`) before any node
joins, and a SuperNode started here refuses a SuperLink whose listening socket is another user's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from typing import Optional

__all__ = ["PEER_TABLES", "GUARD_HEADER", "SameUserOnly", "peer_uid", "listed_peer_uid", "check_peer_lookup",
           "is_guarded", "listener", "socket_inodes", "main"]

PEER_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # Linux: every TCP socket of this network namespace
_ESTABLISHED, _LISTEN = "01", "0A"
REFUSED = b"this Flower deployment accepts only its own user's processes\n"
GUARD_HEADER = "x-same-user-only"  # on every answer of a guarded server: the deployment checks it is there


def _address(field: str) -> tuple:
    """``0100007F:1F90`` (or the 32-hex-digit IPv6 form) as (host, port); a v4-mapped IPv6
    address as its IPv4 form, as the server sees the peer."""
    ip, port = field.split(":")
    words = b"".join(struct.pack("=I", int(ip[i:i + 8], 16)) for i in range(0, len(ip), 8))  # kernel byte order
    return _plain(socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)), int(port, 16)


def _plain(host: str) -> str:
    """An IPv4 address mapped into IPv6 (``::ffff:127.0.0.1``) as the IPv4 address."""
    return host[len("::ffff:"):] if host.startswith("::ffff:") and "." in host else host


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST = 4, 20, 1
_TCP_ESTABLISHED = 1
_NO_COOKIE = struct.pack("=II", 0xFFFFFFFF, 0xFFFFFFFF)


def _diag_address(family: int, host: str) -> bytes:
    """``host`` as the 16 bytes of an ``inet_diag_sockid`` address (IPv4: the first 4)."""
    if family == socket.AF_INET6 and "." in host:
        host = "::ffff:" + host
    return socket.inet_pton(family, host).ljust(16, b"\0")


def _diag_uid(family: int, client: tuple, server: tuple) -> Optional[int]:
    """One exact sock_diag lookup of the socket ``client`` -> ``server``: its owner's uid when it is
    an established connection of a live socket, else None."""
    sockid = (struct.pack(">HH", int(client[1]), int(server[1])) + _diag_address(family, client[0])
              + _diag_address(family, server[0]) + struct.pack("=I", 0) + _NO_COOKIE)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_ESTABLISHED) + sockid
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.sendto(struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + request,
                  (0, 0))
        reply = nl.recv(65536)
    if len(reply) < 16 + 80 or struct.unpack_from("=H", reply, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # an error message: no such socket
    state = struct.unpack_from("=B", reply, 17)[0]
    uid, inode = struct.unpack_from("=II", reply, 16 + 4 + 48 + 12)  # inet_diag_msg: after id, expires, queues
    return uid if state == _TCP_ESTABLISHED and inode else None


def peer_uid(client: tuple, server: tuple) -> Optional[int]:
    """The uid owning the client end of the established TCP connection ``client`` -> ``server``
    (both ``(host, port)`` as the server sees them), or None when there is no such socket (a
    closed one included: a closing socket no longer names its owner)."""
    try:
        families = [socket.AF_INET, socket.AF_INET6] if "." in _plain(client[0]) else [socket.AF_INET6]
        for family in families:  # an IPv4 peer may have connected from an IPv6 socket
            uid = _diag_uid(family, (_plain(client[0]), client[1]), (_plain(server[0]), server[1]))
            if uid is not None:
                return uid
        return None
    except OSError:  # no socket-diagnostics netlink here
        return listed_peer_uid(client, server)


def _tcp_sockets(state: str):
    """The fields of every socket in ``state`` of the kernel's TCP tables that are readable here."""
    for table in PEER_TABLES:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) >= 10 and fields[3] == state:
                yield fields


def listed_peer_uid(client: tuple, server: tuple) -> Optional[int]:
    """:func:`peer_uid` read from the kernel's TCP tables (slow: each read lists every socket)."""
    want_local, want_remote = (_plain(client[0]), int(client[1])), (_plain(server[0]), int(server[1]))
    for fields in _tcp_sockets(_ESTABLISHED):
        if fields[9] == "0":
            continue
        try:
            if _address(fields[1]) == want_local and _address(fields[2]) == want_remote:
                return int(fields[7])
        except (ValueError, OSError):
            continue
    return None


def listener(port: int) -> Optional[tuple]:
    """(uid, socket inode) of a TCP socket listening on ``port`` of a loopback or any-address
    (``0.0.0.0``, ``::``) address, or None when none listens there."""
    for fields in _tcp_sockets(_LISTEN):
        try:
            host, p = _address(fields[1])
        except (ValueError, OSError):
            continue
        if p == int(port) and (host.startswith("127.") or host in ("0.0.0.0", "::", "::1")):
            return int(fields[7]), int(fields[9])
    return None


def socket_inodes(pids) -> set:
    """The inodes of the sockets that the processes ``pids`` hold open (those readable here)."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # a descriptor closed meanwhile
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        found.add(int(link[len("socket:["):-1]))
    return found


def _check_superlink(argv: list) -> None:
    """A SuperNode's start: refuse a loopback ``--superlink`` whose listening socket is another user's."""
    address = argv[argv.index("--superlink") + 1] if "--superlink" in argv[:-1] else ""
    host, _, port = address.rpartition(":")
    if host.startswith("127.") and port.isdigit():
        holder = listener(int(port))
        if holder is not None and holder[0] != os.getuid():
            raise SystemExit(f"the SuperLink at {address} listens on a socket of uid {holder[0]}, not yours "
                             f"(uid {os.getuid()}): this SuperNode does not join it")


def check_peer_lookup() -> None:
    """Raise OSError where this machine does not list its TCP sockets' owners (not Linux)."""
    if not os.access(PEER_TABLES[0], os.R_OK):
        raise OSError(f"a local Flower deployment checks that only your user's processes connect to it by "
                      f"reading {PEER_TABLES[0]} (Linux); this machine has none")


class SameUserOnly:
    """ASGI middleware: 403 to a request from a process of another user (or of no known user)."""

    def __init__(self, app, uid: Optional[int] = None):
        self.app, self.uid = app, os.getuid() if uid is None else uid

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            client, server = scope.get("client"), scope.get("server")
            uid = peer_uid(client, server) if client and server else None
            if uid != self.uid:
                print(f"refused {scope.get('path')!r} from {client} (uid {uid}): not uid {self.uid}",
                      file=sys.stderr, flush=True)  # the server's log says why a caller got 403
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain"), (GUARD_HEADER.encode(), b"1"),
                                        (b"content-length", str(len(REFUSED)).encode())]})
                await send({"type": "http.response.body", "body": REFUSED})
                return

        async def marked_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (GUARD_HEADER.encode(), b"1")]}
            await send(message)
        await self.app(scope, receive, marked_send)


def is_guarded(port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> bool:
    """Whether the HTTP server on ``host:port`` answers with :class:`SameUserOnly` in front (a Flower
    version that no longer builds its app where :func:`main` puts the check would not)."""
    import http.client
    with contextlib.closing(http.client.HTTPConnection(host, port, timeout=timeout)) as conn:
        conn.request("GET", "/health")
        return conn.getresponse().getheader(GUARD_HEADER) == "1"


def _guarded(create_app):
    def create_guarded_app(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.add_middleware(SameUserOnly)  # added last: the outermost, before Flower's own middleware
        return app
    return create_guarded_app


def main(argv: list) -> None:
    """Run ``flower-superlink`` or ``flower-supernode`` (``argv[0]``) with its HTTP app guarded."""
    if not argv or argv[0] not in ("flower-superlink", "flower-supernode"):
        raise SystemExit(f"usage: python {__file__} flower-superlink|flower-supernode ARGS...")
    check_peer_lookup()
    if argv[0] == "flower-superlink":
        import flwr.superlink.main as served
        from flwr.superlink.cli.flower_superlink import flower_superlink as command
    else:
        _check_superlink(argv)
        import flwr.supernode.main as served
        from flwr.supernode.cli.flower_supernode import flower_supernode as command
    # Flower's command imports create_app from this module when it starts serving
    served.create_app = _guarded(served.create_app)
    sys.argv = list(argv)
    command()


if __name__ == "__main__":
    # run as a file, this folder heads sys.path: its modules must not stand in for top-level ones
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    main(sys.argv[1:])
