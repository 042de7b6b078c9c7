"""SCRAM-SHA-256, server side (RFC 5802 §3 and §5, RFC 7677), as PostgreSQL uses it (protocol §55.3.1).

The data owner stores *verifiers*, never passwords, in PostgreSQL's own format
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64 fields), so a verifier can also be copied
from ``pg_authid.rolpassword``. Channel binding (SCRAM-SHA-256-PLUS) is not offered: the client's GS2 header
must be ``n`` or ``y`` (RFC 5802 §6).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata
from dataclasses import dataclass

from sqldp.errors import InputError

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's scram_iterations default
NONCE_BYTES = 18


class AuthFailed(Exception):
    """The exchange failed; the client only ever learns "password authentication failed"."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise InputError(f"invalid base64 in {where}") from None


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def normalise_password(password: str) -> bytes:
    # RFC 5802 §2.2 asks for SASLprep (RFC 4013), whose core is NFKC; libpq does the same and falls back to the
    # raw bytes when the password is not valid SASLprep input, which for ASCII passwords is the identity.
    return unicodedata.normalize("NFKC", password).encode("utf-8")


@dataclass(frozen=True)
class Verifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        return f"{MECHANISM}${self.iterations}:{_b64(self.salt)}${_b64(self.stored_key)}:{_b64(self.server_key)}"


def make_verifier(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> Verifier:
    """SaltedPassword := Hi(password, salt, i); StoredKey := H(HMAC(SaltedPassword, "Client Key")) (RFC 5802 §3)."""
    if not password:
        raise InputError("the password must not be empty")
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", normalise_password(password), salt, iterations)
    stored = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
    return Verifier(iterations, salt, stored, _hmac(salted, b"Server Key"))


def parse_verifier(text: str, where: str) -> Verifier:
    try:
        mech, rest = text.split("$", 1)
        iter_salt, keys = rest.split("$", 1)
        iters, salt = iter_salt.split(":", 1)
        stored, server = keys.split(":", 1)
    except ValueError:
        raise InputError(
            f"not a {MECHANISM} verifier (expected {MECHANISM}$ITER:SALT$STOREDKEY:SERVERKEY)", where=where
        ) from None
    if mech != MECHANISM:
        raise InputError(f"not a {MECHANISM} verifier (starts with {mech!r})", where=where)
    if not iters.isdigit() or not 1 <= int(iters) <= 10_000_000:
        raise InputError(f"invalid iteration count {iters!r}", where=where)
    v = Verifier(int(iters), _unb64(salt, where), _unb64(stored, where), _unb64(server, where))
    if len(v.stored_key) != 32 or len(v.server_key) != 32 or not v.salt:
        raise InputError("verifier keys must be 32 bytes and the salt non-empty", where=where)
    return v


def _attributes(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            raise AuthFailed(f"malformed SCRAM attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


class ScramServer:
    """One SCRAM exchange. ``verifier`` None (an unknown analyst) runs a mock exchange with a salt derived from
    a per-process secret, so the answer does not reveal which analysts exist; it always fails."""

    def __init__(self, verifier: Verifier | None, username: str, mock_secret: bytes) -> None:
        if verifier is None:
            salt = _hmac(mock_secret, username.encode("utf-8"))[:16]
            verifier = Verifier(DEFAULT_ITERATIONS, salt, secrets.token_bytes(32), secrets.token_bytes(32))
            self.mock = True
        else:
            self.mock = False
        self.verifier = verifier
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """client-first-message → server-first-message (RFC 5802 §7)."""
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("client-first-message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise AuthFailed("malformed client-first-message")
        cbind, authzid, bare = parts
        if cbind.startswith("p="):
            raise AuthFailed("channel binding is not offered")
        if cbind not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise AuthFailed("malformed GS2 header")
        attrs = dict(_attributes(bare))
        cnonce = attrs.get("r", "")
        if "n" not in attrs or not cnonce or "m" in attrs:
            raise AuthFailed("client-first-message lacks a user or nonce")
        if any(c < "!" or c > "~" or c == "," for c in cnonce):
            raise AuthFailed("invalid client nonce")
        self._gs2 = f"{cbind},{authzid},"
        self._client_first_bare = bare
        self._nonce = cnonce + _b64(secrets.token_bytes(NONCE_BYTES))
        self._server_first = f"r={self._nonce},s={_b64(self.verifier.salt)},i={self.verifier.iterations}"
        return self._server_first.encode("ascii")

    def final(self, client_final: bytes) -> bytes:
        """client-final-message → server-final-message; raises :class:`AuthFailed` on a wrong proof."""
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("client-final-message is not UTF-8") from None
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthFailed("client-final-message lacks a proof")
        attrs = dict(_attributes(without_proof))
        if attrs.get("c") != _b64(self._gs2.encode("utf-8")):
            raise AuthFailed("channel-binding data does not match the GS2 header")
        # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a failed login)
        if not hmac.compare_digest(attrs.get("r", "").encode("utf-8"), self._nonce.encode("utf-8")):
            raise AuthFailed("nonce mismatch")
        try:
            proof = base64.b64decode(proof_b64.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError):
            raise AuthFailed("proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self.verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthFailed("proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok = hmac.compare_digest(hashlib.sha256(client_key).digest(), self.verifier.stored_key)
        if not ok or self.mock:
            raise AuthFailed("wrong password")
        return f"v={_b64(_hmac(self.verifier.server_key, auth_message))}".encode("ascii")
