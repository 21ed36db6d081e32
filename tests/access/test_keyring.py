"""The key ring's lookup (`app.access.keyring.KeyRing.authenticate`): by the SHA-256 of the secret as
the table stores it (`catalog.keys.hash_secret`), for an ASCII secret hashed from its bytes and for
any other byte string the way the table's hash of its text would be."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest
import structlog

from app.access.keyring import KeyRing
from app.errors import AuthenticationFailed
from app.settings import Settings
from catalog.database import open_engine
from catalog.keys import KeyRecord, hash_secret


def _ring(*secrets: str) -> KeyRing:
    settings = Settings()
    ring = KeyRing(open_engine("sqlite+aiosqlite://"), settings.auth, None, structlog.get_logger("test"))
    now = datetime.now(UTC)
    for index, secret in enumerate(secrets):
        hashed = hash_secret(secret)
        ring.apply(KeyRecord(id=f"k{index}", secret_hash=hashed, prefix="", name="k", created_at=now, updated_at=now))
    return ring


@pytest.mark.parametrize(
    ("header", "value"),
    [(b"authorization", b"Bearer sy-" + b"a" * 43), (b"x-api-key", b"sy-" + b"a" * 43)],
)
def test_an_ascii_secret_is_found_by_its_hash(header: bytes, value: bytes) -> None:
    ring = _ring("sy-" + "b" * 43, "sy-" + "a" * 43)
    assert ring.authenticate([(b"host", b"x"), (header, value)]).record.id == "k1"


def test_a_secret_of_other_bytes_is_found_as_its_text_was_hashed() -> None:
    secret = "sy-caf\u00e9-" + "a" * 40  # sent as latin-1 bytes, the way an HTTP header carries them
    ring = _ring(secret)
    assert ring.authenticate([(b"authorization", b"Bearer " + secret.encode("latin-1"))]).record.id == "k0"


def test_an_unknown_or_missing_secret_is_refused() -> None:
    ring = _ring("sy-" + "a" * 43)
    for headers in ([(b"authorization", b"Bearer sy-" + b"c" * 43)], [(b"x-api-key", b"sy-caf\xe9")], []):
        with pytest.raises(AuthenticationFailed):
            ring.authenticate(headers)


_A, _B = b"sy-" + b"a" * 43, b"sy-" + b"b" * 43


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"x-api-key", _A), (b"authorization", b"Bearer " + _B)], "k1"),
        ([(b"authorization", b"Bearer " + _B), (b"x-api-key", _A)], "k0"),
        ([(b"authorization", b"Bearer " + _A), (b"authorization", b"bearer " + _B)], "k1"),
        ([(b"x-api-key", _A), (b"authorization", b"Token " + _B)], "k0"),  # another scheme is not a key
        ([(b"x-api-key", _B), (b"authorization", b"Basic " + base64.b64encode(b"u:" + _A))], "k0"),
        ([(b"authorization", b"Basic " + base64.b64encode(b"spend:" + _B))], "k1"),
        ([(b"x-api-key", b"  " + _A + b" ")], "k0"),
    ],
)
def test_the_last_credential_sent_is_the_one_used(headers: list[tuple[bytes, bytes]], expected: str) -> None:
    ring = _ring(_A.decode(), _B.decode())
    assert ring.authenticate(headers).record.id == expected


def test_an_authorization_of_another_scheme_alone_is_refused() -> None:
    ring = _ring(_A.decode())
    with pytest.raises(AuthenticationFailed):
        ring.authenticate([(b"authorization", b"Token " + _A)])
