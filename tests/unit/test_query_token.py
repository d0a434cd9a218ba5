"""The state-query token: derived from the ZooKeeper digest, overridden explicitly, never shown."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from pydantic import ValidationError

from stream_ops.config import QUERY_TOKEN_LABEL, QueryConfig, ZooKeeperConfig, query_token
from stream_ops.runtime.query_client import QueryAccess
from stream_ops.runtime.worker import WorkerSettings

DIGEST = "stream-ops:correct-horse-battery-staple"
EXPLICIT = "an-explicit-query-token-0123456789"


def test_the_token_is_derived_from_the_zookeeper_digest() -> None:
    token = query_token(QueryConfig(), ZooKeeperConfig(auth_digest=DIGEST))
    assert token == hmac.new(DIGEST.encode(), QUERY_TOKEN_LABEL, hashlib.sha256).hexdigest()
    assert token == query_token(QueryConfig(), ZooKeeperConfig(hosts="zk1:2181", chroot="/other", auth_digest=DIGEST))
    assert token != query_token(QueryConfig(), ZooKeeperConfig(auth_digest="stream-ops:another-password"))
    assert "correct-horse" not in token
    assert query_token(QueryConfig(), ZooKeeperConfig()) is None


def test_an_explicit_token_wins_over_the_derived_one() -> None:
    query = QueryConfig(token=EXPLICIT)
    assert query_token(query, ZooKeeperConfig(auth_digest=DIGEST)) == EXPLICIT
    assert query_token(query, ZooKeeperConfig()) == EXPLICIT
    access = QueryAccess.resolve(ZooKeeperConfig(auth_digest=DIGEST), query)
    assert access.headers() == {"Authorization": f"Bearer {EXPLICIT}"} and access.scheme == "http"
    assert QueryAccess.resolve(ZooKeeperConfig()).headers() == {}


def test_the_secret_is_never_in_repr_or_validation_errors() -> None:
    query = QueryConfig(token=EXPLICIT)
    settings = WorkerSettings(query=query)
    access = QueryAccess.resolve(ZooKeeperConfig(auth_digest=DIGEST), query)
    for shown in (repr(query), str(query), repr(settings), repr(access), query.model_dump_json()):
        assert EXPLICIT not in shown
    derived = QueryAccess.resolve(ZooKeeperConfig(auth_digest=DIGEST))
    assert derived.token is not None and derived.token not in repr(derived)
    too_short = "short-secret"
    with pytest.raises(ValidationError) as caught:
        QueryConfig(token=too_short)
    assert too_short not in str(caught.value) and "at least 16" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        WorkerSettings(query={"token": too_short})
    assert too_short not in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        QueryConfig(token="a token with spaces in it")
    assert "with spaces" not in str(caught.value)


def test_tls_settings_must_be_complete(tmp_path: Path) -> None:
    cert, key, ca = tmp_path / "w.pem", tmp_path / "w.key", tmp_path / "ca.pem"
    with pytest.raises(ValidationError, match="give both tls_cert and tls_key"):
        QueryConfig(tls_cert=cert, tls_ca=ca)
    with pytest.raises(ValidationError, match="give tls_ca as well"):
        QueryConfig(tls_cert=cert, tls_key=key)
    assert QueryConfig(tls_cert=cert, tls_key=key, tls_ca=ca).tls_ca == ca
