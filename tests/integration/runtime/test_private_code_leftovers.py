"""A SIGKILLed worker's private code copy (``stream-ops-code-*``) does not stay in the temp
directory for good (issue 31, item 2): the next worker of the same user installing code there
removes the copies of processes that are gone, and nothing else: not a live process's copy,
not a symlink or what it points to, not a name of another pattern, not another user's."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

from stream_ops.coordination.records import StormRecord
from stream_ops.dsl.build_plan import build_plan
from stream_ops.examples.wordcount import build_wordcount
from stream_ops.nimbus.dist_store import load_submission, write_submission
from stream_ops.runtime.owned_dirs import Owner, this_process
from stream_ops.runtime.user_code import CODE_DIRS, PrivateArchives

REPO = Path(__file__).resolve().parents[3]

_CHILD = """
import sys
from pathlib import Path
from stream_ops.coordination.records import StormRecord
from stream_ops.nimbus.dist_store import load_submission
from stream_ops.runtime.user_code import PRIVATE_ARCHIVES

dist_root, record, parent = Path(sys.argv[1]), StormRecord.model_validate_json(sys.argv[2]), Path(sys.argv[3])
scope = PRIVATE_ARCHIVES.install(load_submission(dist_root, record), parent)  # the worker's, removed at exit
print(Path(scope.archive).parent, flush=True)
sys.stdin.read()  # until the test closes stdin, or kills this process
"""


def _submission(tmp_path: Path) -> tuple[Path, StormRecord]:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("userpkg/__init__.py", "")
    dist = tmp_path / "dist" / "wc-1-1700000000"
    written = write_submission(dist, build_plan(build_wordcount(tmp_path / "in")), {}, buffer.getvalue())
    record = StormRecord(
        topology_id=dist.name,
        name="wc",
        status="ACTIVE",
        workers=1,
        dist_dir=str(dist.resolve()),
        submitted_at=0.0,
        num_tasks=4,
        code_sha256=written.code_sha256,
        submission_sha256=written.submission_sha256,
    )
    return dist.parent, record


def _worker_like_process(dist_root: Path, record: StormRecord, parent: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that installs the submission's code under ``parent`` as a worker does, and waits."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(dist_root), record.model_dump_json(), str(parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the child: it prints at once or exits (EOF)
    assert line, f"the process exited with {proc.wait(30)} before installing the code"
    return proc, Path(line.strip())


def test_the_copies_of_dead_processes_are_removed_by_the_next_install(tmp_path: Path) -> None:
    dist_root, record = _submission(tmp_path)
    parent = tmp_path / "local"
    parent.mkdir(mode=0o700)

    killed, killed_copy = _worker_like_process(dist_root, record, parent)
    alive, alive_copy = _worker_like_process(dist_root, record, parent)
    try:
        assert killed_copy.parent == parent and killed_copy.is_dir()
        owner = CODE_DIRS.owner_of(killed_copy.name)
        assert owner is not None and owner.pid == killed.pid
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(30)
        assert killed_copy.is_dir(), "a SIGKILLed process cannot remove its copy itself"

        me = this_process()
        assert me is not None
        # The pid of a live process (this one) with another start time: a dead owner whose pid was reused.
        reused = parent / f"stream-ops-code-{'a' * 16}-{Owner(me.pid_namespace, me.pid, me.start_ticks - 1)}-reused00"
        reused.mkdir()
        (reused / "x.zip").write_bytes(b"PK")
        # A dead owner's name on a symlink: neither the link nor what it points to may go.
        victim = tmp_path / "victim"
        victim.mkdir()
        (victim / "keep.txt").write_text("mine")
        link = parent / f"{killed_copy.name[:-8]}link0000"
        link.symlink_to(victim, target_is_directory=True)
        # Names of the kind but not of the pattern (an earlier release's copy, or anything else).
        unowned = parent / f"stream-ops-code-{'b' * 16}-abcd1234"
        unowned.mkdir()
        # An owner in another pid namespace cannot be checked from here: kept.
        foreign = parent / f"stream-ops-code-{'c' * 16}-{Owner(me.pid_namespace + 1, killed.pid, 1)}-foreign0"
        foreign.mkdir()
        other_user = parent / f"stream-ops-code-{'d' * 16}-{Owner(me.pid_namespace, killed.pid, 1)}-otheruid"
        other_user.mkdir()
        if os.geteuid() == 0:  # only root can give a directory to another user
            os.chown(other_user, 54321, 54321)

        archives = PrivateArchives()
        try:
            scope = archives.install(load_submission(dist_root, record), parent)
            mine = Path(scope.archive).parent
            assert not killed_copy.exists(), "the SIGKILLed process's copy was not removed"
            assert not reused.exists(), "a copy whose pid now runs another process was kept"
            assert alive_copy.is_dir() and any(alive_copy.iterdir()), "a live process's copy was touched"
            assert link.is_symlink() and (victim / "keep.txt").read_text() == "mine"
            assert unowned.is_dir() and foreign.is_dir()
            assert other_user.is_dir() == (os.geteuid() == 0)
            assert mine.is_dir() and CODE_DIRS.owner_of(mine.name) == me
        finally:
            archives.remove_all()
        assert alive.stdin is not None
        alive.stdin.close()  # a clean exit: the process removes its own copy
        assert alive.wait(30) == 0
        assert not alive_copy.exists()
    finally:
        for proc in (killed, alive):
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
