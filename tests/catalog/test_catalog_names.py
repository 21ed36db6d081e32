"""Catalog names refuse what a key's name refuses (`catalog.keys.checked`): a line or paragraph
separator and the bidirectional overrides break the rows of `switchyard usage` as a new line does;
and the refusal names the key printably (a C1 control, 0x9b, is a terminal's CSI)."""

from __future__ import annotations

import pytest

from catalog.files import CatalogFileError, parse_catalog


@pytest.mark.parametrize("name", ["a\u2028b", "a\u2029b", "a\u202eb", "a\x9b31mb", "a\x7fb"])
def test_a_catalog_name_that_breaks_a_report_row_is_refused_printably(name: str) -> None:
    escaped = name.encode("unicode_escape").decode().replace("\\x", "\\u00")
    for text in (
        f'[models."{escaped}"]\ncontext_window = 1\nmax_output = 1\n',
        f'[models.m]\ncontext_window = 1\nmax_output = 1\naliases = ["{escaped}"]\n',
        f'[models.m]\ncontext_window = 1\nmax_output = 1\n[[models.m.deployments]]\nprovider = "p"\n'
        f'upstream_model = "{escaped}"\n',
    ):
        with pytest.raises(CatalogFileError) as refused:
            parse_catalog(text, "c.toml")
        assert refused.value.message.endswith(": must not hold a control character")
        assert refused.value.message.isprintable(), refused.value.message


def test_a_price_naming_a_model_with_a_control_character_is_refused_printably() -> None:
    """It was refused only later, as an unknown model, quoting the name as it is (an ESC and all)."""
    text = (
        '[models.m]\ncontext_window = 1\nmax_output = 1\n[[prices]]\nprovider = "p"\nmodel = "m\\u001b[31m"\n'
        'effective_from = 2026-01-01\ninput = "1"\noutput = "1"\n'
    )
    with pytest.raises(CatalogFileError) as refused:
        parse_catalog(text, "c.toml")
    assert refused.value.message == "c.toml: prices[0].model: must not hold a control character"
