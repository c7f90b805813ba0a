"""`encrypted_content` of Responses reasoning Items, so Codex-style replays (summary + that string
only) rebuild the raw reasoning. Standard library only. Integrity, not secrecy (the text is also
in `content`): `nr1.<base64url JSON>.<base64url HMAC-SHA256>` over version, payload and served
model id under the server key; anything that does not authenticate opens to None (omitted).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets

VERSION = "nr1"
KEY_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    """Seals and opens reasoning text for one server key and one served model id."""

    def __init__(self, key: bytes | None, model_id: str) -> None:
        # A per-process random key when none is configured: replays then work until a restart.
        self._key = key if key else secrets.token_bytes(KEY_BYTES)
        self._model = model_id.encode("utf-8")

    def _mac(self, payload: str) -> bytes:
        message = b"\0".join((VERSION.encode(), self._model, payload.encode("ascii")))
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def seal(self, text: str) -> str:
        payload = _b64(json.dumps({"t": text}, ensure_ascii=False).encode("utf-8"))
        return f"{VERSION}.{payload}.{_b64(self._mac(payload))}"

    def open(self, sealed: object) -> str | None:
        """The reasoning text, or None when `sealed` is not ours (never raises)."""
        if not isinstance(sealed, str) or not sealed.isascii():
            return None
        parts = sealed.split(".")
        if len(parts) != 3 or parts[0] != VERSION:
            return None
        _, payload, tag = parts
        try:
            if not hmac.compare_digest(_unb64(tag), self._mac(payload)):
                return None
            text = json.loads(_unb64(payload).decode("utf-8")).get("t")
        except (binascii.Error, ValueError, UnicodeDecodeError, AttributeError):
            return None
        return text if isinstance(text, str) else None


def key_from_text(secret: str) -> bytes:
    """A stable key from an operator's secret text (any length): its SHA-256."""
    return hashlib.sha256(secret.encode("utf-8")).digest()
