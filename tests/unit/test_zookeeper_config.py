"""``ZooKeeperConfig.auth_digest`` is a secret: no repr, str, dump or validation error shows it
(issue 17, item 8), while everything that needs the clear text still gets it."""

from __future__ import annotations

import traceback as tb

import pytest
from pydantic import ValidationError

from stream_ops.config import QueryConfig, ZooKeeperConfig, query_token
from stream_ops.coordination.acl import cluster_acl, digest_identity

PASSWORD = "hunter2-but-longer-9f3a"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"auth_digest": f":{PASSWORD}"}, "user:password"),
        ({"auth_digest": f"{PASSWORD}"}, "user:password"),
        ({"auth_digest": f"so:{PASSWORD}", "chroot": "/"}, "must own its tree"),
        ({"auth_digest": f"so:{PASSWORD}", "insecure": True}, "only allows running without auth_digest"),
        ({"auth_digest": f"so:{PASSWORD}", "hosts": "no-port"}, "host:port"),
        ({"auth_digest": f"so:{PASSWORD}", "session_timeout_s": 0}, "greater than 0"),
    ],
)
def test_validation_errors_never_contain_the_password(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message) as refused:
        ZooKeeperConfig(**kwargs)  # type: ignore[arg-type]
    # What logs, tracebacks, the CLI and the Dagster resource show (errors() keeps the raw input
    # for programs, as pydantic always does; none of ours prints it).
    traceback = "".join(tb.format_exception(refused.value))
    for shown in (str(refused.value), repr(refused.value), traceback):
        assert PASSWORD not in shown
    assert PASSWORD not in repr(refused.value.errors(include_input=False))


def test_repr_str_and_dumps_never_contain_the_password() -> None:
    config = ZooKeeperConfig(auth_digest=f"so:{PASSWORD}", open_reads=True)
    for shown in (repr(config), str(config), config.model_dump_json(), repr(config.model_dump())):
        assert PASSWORD not in shown
    # model_copy(update=...) skips validation: a plain string there is hidden too.
    copied = config.model_copy(update={"auth_digest": f"so:{PASSWORD}"})
    assert PASSWORD not in repr(copied) and PASSWORD not in str(copied)
    assert copied.auth_credentials() == f"so:{PASSWORD}"


def test_callers_of_the_digest_still_get_the_clear_text() -> None:
    config = ZooKeeperConfig(auth_digest=f"so:{PASSWORD}")
    assert config.auth_credentials() == f"so:{PASSWORD}"
    acl = cluster_acl(config)
    assert acl is not None and acl[0].id.id == digest_identity(f"so:{PASSWORD}")
    token = query_token(QueryConfig(), config)
    assert token is not None and len(token) == 64 and PASSWORD not in token
    assert ZooKeeperConfig().auth_credentials() is None
