"""``python -m stream_ops.coordination.ensemble digest`` reads the password from stdin or a file,
never from the command line (issue 17, item 8)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from stream_ops.coordination.acl import digest_identity
from stream_ops.coordination.ensemble import read_password

PASSWORD = "zk-super-admin-5e1d"
COMMAND = [sys.executable, "-m", "stream_ops.coordination.ensemble", "digest"]


def test_digest_reads_the_password_from_stdin() -> None:
    result = subprocess.run([*COMMAND, "super"], input=PASSWORD + "\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == digest_identity(f"super:{PASSWORD}")
    assert PASSWORD not in result.stdout + result.stderr


def test_digest_reads_the_password_from_a_file(tmp_path: Path) -> None:
    password_file = tmp_path / "super.pw"
    password_file.write_text(PASSWORD + "\n", encoding="utf-8")
    result = subprocess.run(
        [*COMMAND, "super", "--password-file", str(password_file)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == digest_identity(f"super:{PASSWORD}")


def test_digest_refuses_a_password_on_the_command_line() -> None:
    result = subprocess.run([*COMMAND, f"super:{PASSWORD}"], input="", capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "never from the command line" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr


def test_read_password_keeps_inner_spaces_and_refuses_empty(tmp_path: Path) -> None:
    assert read_password(None, io.StringIO(" pass word \r\n")) == " pass word "
    with pytest.raises(ValueError, match="empty"):
        read_password(None, io.StringIO("\n"))
    with pytest.raises(ValueError, match="cannot read"):
        read_password(str(tmp_path / "missing"))
