"""Credential masking on its own: URLs, their query strings, libpq key/value DSNs."""

from __future__ import annotations

import pytest

from oncely.masking import mask_secrets, mask_url


def test_a_query_password_is_masked_and_the_other_parameters_stay() -> None:
    text = "cannot reach postgresql://db/x?password=S3c&retQ=1 now"
    assert mask_secrets(text) == "cannot reach postgresql://db/x?password=***&retQ=1 now"


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("host=db password=S3c user=app", "host=db password=*** user=app"),
        ("host=db password = 'a b\\' c' dbname=x", "host=db password = *** dbname=x"),
        ("host=db sslpassword=S3c sslmode=require", "host=db sslpassword=*** sslmode=require"),
        ("dbname=x PASSWORD=S3c", "dbname=x PASSWORD=***"),
    ],
)
def test_a_libpq_dsn_loses_its_password_only(dsn: str, masked: str) -> None:
    assert mask_secrets(dsn) == masked
    in_error = mask_secrets(f"error: not a database URL: {dsn!r}")
    assert "S3c" not in in_error and "a b" not in in_error
    assert mask_url(dsn) == masked


def test_a_dsn_beside_a_url_is_masked_in_the_same_pass() -> None:
    text = "postgresql://app:pw@db/x?password=S3c&retQ=1 host=db password=Dsn5ecret"
    assert mask_secrets(text) == (
        "postgresql://app:***@db/x?password=***&retQ=1 host=db password=***"
    )


def test_fields_that_are_not_secrets_stay() -> None:
    line = "run.skipped job=close key=2026-11-28T00:00:00Z slot=x replica=vm:1"
    assert mask_secrets(line) == line
