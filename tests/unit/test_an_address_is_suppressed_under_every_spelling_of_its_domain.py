"""The keys a recipient is suppressed under (domain/suppression.py): its own, lower-cased, and
for an internationalised domain the other spelling that reaches the same mailbox (punycode as
the wire carries it, or the Unicode it decodes to). Whatever SQL cannot key alike is keyed in
Python."""

from __future__ import annotations

import pytest

from notifier.domain.suppression import address_key, address_keys, sql_keys_alike

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("target", "keys"),
    [
        ("Ann@Example.com", ("ann@example.com",)),
        ("Ann@Bücher.example", ("ann@bücher.example", "ann@xn--bcher-kva.example")),
        ("ann@XN--BCHER-KVA.example", ("ann@xn--bcher-kva.example", "ann@bücher.example")),
        # IDNA 2008's spelling of ß (2003's maps it to "ss", another domain).
        ("Ann@Straße.de", ("ann@straße.de", "ann@xn--strae-oqa.de")),
        ("ann@XN--STRAE-OQA.de", ("ann@xn--strae-oqa.de", "ann@straße.de")),
        ("ann@xn--zz.example", ("ann@xn--zz.example",)),  # not punycode at all: one key
        ("not an address", ("not an address",)),
    ],
)
def test_the_keys_of_a_recipient(target: str, keys: tuple[str, ...]) -> None:
    assert address_keys(target) == keys


@pytest.mark.parametrize("row", ["ann@bücher.café.fr", "ann@xn--bcher-kva.xn--caf-dma.fr"])
@pytest.mark.parametrize(
    "entry", ["ann@bücher.xn--caf-dma.fr", "ann@xn--bcher-kva.café.fr", "Ann@Bücher.Café.fr"]
)
def test_an_entry_in_any_mix_of_spellings_is_among_a_rows_keys(entry: str, row: str) -> None:
    """An entry is stored under the key of the spelling it was given, any label in either
    spelling: a row in any spelling is looked up under every one of them."""
    assert address_key(entry) in address_keys(row)


def test_a_domain_of_many_internationalised_labels_has_its_two_whole_spellings() -> None:
    """Past a few internationalised labels a row is looked up under its whole spellings
    only (not every mix: 2 to the power of the labels)."""
    keys = address_keys("ann@" + ".".join(["bücher"] * 8) + ".de")
    assert keys == ("ann@" + ".".join(["bücher"] * 8) + ".de",
                    "ann@" + ".".join(["xn--bcher-kva"] * 8) + ".de")  # fmt: skip


@pytest.mark.parametrize(
    ("target", "alike"),
    [("ann@example.com", True), ("ann@bücher.example", False),
     ("ann@XN--BCHER-KVA.example", False), ("\tann@example.com", False)],
)  # fmt: skip
def test_sql_keys_only_a_plain_ascii_address(target: str, alike: bool) -> None:
    assert sql_keys_alike(target) is alike
