"""RFC 6455 WebSocket framing, server side, in the standard library: handshake key, frames.

Clients mask what they send; the server never masks. Fragmented messages are reassembled.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from io import BufferedIOBase

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_FRAME = 16 * 1024 * 1024  # far above any Socket Mode ack; guards against garbage lengths


def accept_key(client_key: str) -> str:
    """The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key."""
    digest = hashlib.sha1((client_key.strip() + GUID).encode(), usedforsecurity=False).digest()
    return base64.b64encode(digest).decode()


def encode(opcode: int, payload: bytes = b"") -> bytes:
    """One final, unmasked frame."""
    head = bytes([0x80 | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([size])
    elif size < 1 << 16:
        head += bytes([126]) + struct.pack("!H", size)
    else:
        head += bytes([127]) + struct.pack("!Q", size)
    return head + payload


def close_frame(code: int = 1000, reason: str = "") -> bytes:
    return encode(CLOSE, struct.pack("!H", code) + reason.encode())


def _read_exact(stream: BufferedIOBase, size: int) -> bytes | None:
    data = stream.read(size) if size else b""
    return data if data is not None and len(data) == size else None


def read_frame(stream: BufferedIOBase) -> tuple[int, bool, bytes] | None:
    """(opcode, fin, unmasked payload) of the next frame, or None when the peer is gone."""
    head = _read_exact(stream, 2)
    if head is None:
        return None
    fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
    masked, size = bool(head[1] & 0x80), head[1] & 0x7F
    if size in (126, 127):
        extended = _read_exact(stream, 2 if size == 126 else 8)
        if extended is None:
            return None
        size = struct.unpack("!H" if len(extended) == 2 else "!Q", extended)[0]
    if size > MAX_FRAME:
        return None
    mask = _read_exact(stream, 4) if masked else b""
    payload = _read_exact(stream, size)
    if mask is None or payload is None:
        return None
    if masked:
        payload = bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))
    return opcode, fin, payload


def read_message(stream: BufferedIOBase) -> tuple[int, bytes] | None:
    """The next message: a control frame as is, or a data message with its fragments joined."""
    first = read_frame(stream)
    if first is None:
        return None
    opcode, fin, payload = first
    while not fin and opcode not in (CLOSE, PING, PONG):
        following = read_frame(stream)
        if following is None:
            return None
        _, fin, more = following
        payload += more
    return opcode, payload
