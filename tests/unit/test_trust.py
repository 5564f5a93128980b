"""How a CA bundle is split and capped before OpenSSL reads it, and what the trust store keeps.

The downloads themselves, over real TLS, are in tests/source/test_ca_bundles.py.
"""

from __future__ import annotations

import pytest
import trustme

from servegraph.source import trust
from servegraph.source.trust import MAX_BUNDLE_BYTES, InvalidBundle, TrustStore, certificates


@pytest.fixture(scope="module")
def pem() -> str:
    return trustme.CA().cert_pem.bytes().decode()


def test_text_between_blocks_and_other_kinds_of_block_are_skipped_as_openssl_skips_them(pem: str) -> None:
    key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
    bundle = f"# Issuer: one\n{pem}\n# Issuer: two\n{key}{pem.replace('CERTIFICATE', 'TRUSTED CERTIFICATE')}"
    assert certificates(bundle) == [pem.strip(), pem.replace("CERTIFICATE", "TRUSTED CERTIFICATE").strip()]


@pytest.mark.parametrize(
    ("bundle", "detail"),
    [
        ("no PEM at all", "no certificate in it"),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "no certificate in it"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n", "PEM block 1 has no end"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END X509 CRL-----\n", "PEM block 1 has no end"),
    ],
)
def test_what_cannot_be_certificates_is_refused_before_any_parse(bundle: str, detail: str) -> None:
    with pytest.raises(InvalidBundle) as err:
        certificates(bundle)
    assert (str(err.value), err.value.detail) == ("the CA bundle is not valid PEM certificates", detail)


def test_the_size_limit_is_on_the_text_as_given(pem: str) -> None:
    exact = pem + "#" * (MAX_BUNDLE_BYTES - len(pem))
    assert certificates(exact) == [pem.strip()]
    with pytest.raises(InvalidBundle, match=f"over the limit of {MAX_BUNDLE_BYTES} bytes"):
        certificates(exact + "#")


async def test_a_bundle_openssl_refuses_names_the_certificate_and_is_remembered(pem: str) -> None:
    store = TrustStore()
    bundle = pem + "-----BEGIN CERTIFICATE-----\nTUlJ\n-----END CERTIFICATE-----\n"
    for _ in range(3):
        with pytest.raises(InvalidBundle) as err:
            await store.context(bundle)
        assert err.value.detail.startswith("certificate 2: ")
    assert store.builds == 1
    assert await store.context(pem) is await store.context(pem)  # a good one is one context
    assert store.builds == 2


async def test_what_the_store_remembers_is_bounded(pem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "KEPT_FAILURES", 2)
    store = TrustStore()
    bad = [f"# {i}\n-----BEGIN CERTIFICATE-----\nTUlJ\n-----END CERTIFICATE-----\n" for i in range(3)]
    for bundle in [*bad, bad[0]]:
        with pytest.raises(InvalidBundle):
            await store.context(bundle)
    assert store.builds == 4  # the first was forgotten when the third came: read again
    assert len(store._failures) == 2
