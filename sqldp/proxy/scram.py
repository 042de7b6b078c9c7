"""SCRAM-SHA-256 and SCRAM-SHA-256-PLUS, server side (RFC 5802, RFC 7677), as PostgreSQL uses them (protocol
§55.3.1), through the ``scramp`` library: its SASLprep (RFC 4013) when a verifier is made, its message
parsing and proof check, and its ``tls-server-end-point`` channel binding (RFC 5929 §4) over the proxy's TLS.

The data owner stores *verifiers*, never passwords, in PostgreSQL's own format
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64 fields), so a verifier can also be copied
from ``pg_authid.rolpassword``. Two things PostgreSQL does that ``scramp`` does not are bridged here:

* libpq sends an empty user name (``n=,``) in its client-first-message, since PostgreSQL takes the user from
  the startup message and ignores this one (protocol §55.3.1); ``scramp`` wants a non-empty one, so it is
  handed ``n=*`` (what pgjdbc sends) and the proof is checked over the message the client really sent
  (RFC 5802 §3: the AuthMessage is made of the messages as exchanged).
* PostgreSQL accepts any iteration count; ``scramp`` (like pg8000) refuses fewer than 4096, RFC 7677 §4's
  minimum, so a verifier with fewer is refused when the policy is loaded rather than failing every login.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from sqldp.errors import InputError

MECHANISM = "SCRAM-SHA-256"
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's scram_iterations default, and RFC 7677's minimum
MIN_SALT = 12  # bytes; scramp's minimum (PostgreSQL's salts are 16)
CHANNEL_BINDING = "tls-server-end-point"  # the binding libpq supports (RFC 5929 §4)


class AuthFailed(Exception):
    """The exchange failed; the client only ever learns "password authentication failed"."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise InputError(f"invalid base64 in {where}") from None


@dataclass(frozen=True)
class Verifier:
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        return f"{MECHANISM}${self.iterations}:{_b64(self.salt)}${_b64(self.stored_key)}:{_b64(self.server_key)}"


def make_verifier(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> Verifier:
    """SaltedPassword := Hi(SASLprep(password), salt, i); StoredKey := H(HMAC(SaltedPassword, "Client Key"))
    (RFC 5802 §3), by ``scramp``. A password SASLprep refuses (control, private-use or unassigned characters)
    is refused: libpq would then use its raw bytes and pg8000 would refuse it, so no verifier serves both."""
    import scramp

    if not password:
        raise InputError("the password must not be empty")
    if iterations < DEFAULT_ITERATIONS:
        raise InputError(f"the iteration count must be at least {DEFAULT_ITERATIONS} (RFC 7677), got {iterations}")
    salt = salt if salt is not None else secrets.token_bytes(16)
    try:
        salt, stored, server, i = scramp.ScramMechanism(MECHANISM).make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
    except scramp.ScramException as exc:
        raise InputError(f"the password cannot be used with SCRAM: {exc.args[0]} (SASLprep, RFC 4013)") from None
    return Verifier(i, salt, stored, server)


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
    if not iters.isascii() or not iters.isdigit() or not 1 <= int(iters) <= 10_000_000:
        raise InputError(f"invalid iteration count {iters!r}", where=where)
    if int(iters) < DEFAULT_ITERATIONS:
        raise InputError(
            f"iteration count {iters} is under {DEFAULT_ITERATIONS}, RFC 7677's minimum, which the SCRAM library "
            "and pg8000 enforce; make a new verifier with `sqldp budget passwd NAME`",
            where=where,
        )
    v = Verifier(int(iters), _unb64(salt, where), _unb64(stored, where), _unb64(server, where))
    if len(v.stored_key) != 32 or len(v.server_key) != 32 or len(v.salt) < MIN_SALT:
        raise InputError(f"verifier keys must be 32 bytes and the salt at least {MIN_SALT}", where=where)
    return v


def mechanisms(tls: bool) -> list[str]:
    """What the server offers (AuthenticationSASL), in PostgreSQL's order: -PLUS first, and only over TLS."""
    return [MECHANISM_PLUS, MECHANISM] if tls else [MECHANISM]


def channel_binding(cert_pem: str | None) -> tuple[str, str] | None:
    """The ``tls-server-end-point`` binding for ``scramp``: the server certificate's PEM text (scramp hashes
    the first certificate with its signature's hash, SHA-256 for MD5 and SHA-1, RFC 5929 §4.1)."""
    return (CHANNEL_BINDING, cert_pem) if cert_pem else None


class ScramServer:
    """One SCRAM exchange with the mechanism the client chose. ``verifier`` None (an unknown analyst) runs a
    mock exchange with a salt derived from a per-process secret, so the answer does not reveal which
    analysts exist; it always fails. ``binding``: :func:`channel_binding` of the TLS connection, or None."""

    def __init__(
        self,
        verifier: Verifier | None,
        username: str,
        mock_secret: bytes,
        *,
        mechanism: str = MECHANISM,
        binding: tuple[str, str] | None = None,
    ) -> None:
        import scramp

        if verifier is None:
            salt = hmac.new(mock_secret, username.encode("utf-8"), hashlib.sha256).digest()[:16]
            verifier = Verifier(DEFAULT_ITERATIONS, salt, secrets.token_bytes(32), secrets.token_bytes(32))
            self.mock = True
        else:
            self.mock = False
        if mechanism not in (MECHANISM, MECHANISM_PLUS) or (mechanism == MECHANISM_PLUS and binding is None):
            raise AuthFailed(f"unsupported SASL mechanism {mechanism!r}")
        self.mechanism = mechanism
        info = (verifier.salt, verifier.stored_key, verifier.server_key, verifier.iterations)
        try:
            self._server: Any = scramp.ScramMechanism(mechanism).make_server(lambda _user: info, binding)
        except scramp.ScramException as exc:
            raise AuthFailed(str(exc)) from None
        self._errors: tuple[type[Exception], ...] = (scramp.ScramException,)

    def first(self, client_first: bytes) -> bytes:
        """client-first-message → server-first-message (RFC 5802 §7)."""
        text = self._text(client_first, "client-first-message")
        header, sep, bare = text.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not (sep and sep2):
            raise AuthFailed("malformed client-first-message")
        if header.startswith("p=") and self.mechanism == MECHANISM:
            # as PostgreSQL: binding data with the plain mechanism is refused (scramp would upgrade to -PLUS);
            # the rest — 'n' with -PLUS, 'y' when the server does offer binding — scramp refuses itself
            raise AuthFailed("channel binding requested with the mechanism that has none")
        # PostgreSQL ignores this user name (the startup message's counts); scramp wants one
        named = bare if not bare.startswith("n=,") else "n=*," + bare[3:]
        try:
            self._server.set_client_first(f"{header},{authzid},{named}")
            self._server.client_first_bare = bare  # the proof is over the message the client sent (RFC 5802 §3)
            return str(self._server.get_server_first()).encode("ascii")
        except self._errors as exc:
            raise AuthFailed(str(exc)) from None

    def final(self, client_final: bytes) -> bytes:
        """client-final-message → server-final-message; raises :class:`AuthFailed` on a wrong proof."""
        text = self._text(client_final, "client-final-message")
        try:
            self._server.set_client_final(text)
            final = str(self._server.get_server_final())
        except self._errors as exc:
            raise AuthFailed(str(exc)) from None
        if self.mock:
            raise AuthFailed("wrong password")
        return final.encode("ascii")

    @staticmethod
    def _text(message: bytes, what: str) -> str:
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed(f"{what} is not UTF-8") from None
