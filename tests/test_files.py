"""dask_rpm._files: one atomic writer that honours the umask and never replaces a non-regular file."""

from __future__ import annotations

import os
import stat

import pytest

from dask_rpm._files import (
    TargetError,
    atomic_write,
    atomic_write_text,
    check_target,
    unwritable_reason,
)


@pytest.fixture
def umask027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_honours_the_umask(tmp_path, umask027):
    path = atomic_write_text(tmp_path / "a.txt", "hello")
    assert open(path).read() == "hello"
    assert _mode(path) == 0o640  # 0666 & ~027; mkstemp alone would give 0600
    os.umask(0o002)
    assert _mode(atomic_write_text(tmp_path / "b.txt", "x")) == 0o664


def test_replacing_keeps_the_old_files_mode_and_leaves_no_temporary(tmp_path, umask027):
    path = tmp_path / "a.txt"
    path.write_text("old")
    os.chmod(path, 0o604)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o604
    assert os.listdir(tmp_path) == ["a.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")

    def boom(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, boom)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["a.txt"]


def test_never_replaces_a_device_or_directory(tmp_path):
    with pytest.raises(TargetError, match="'/dev/full': it is a device, not a regular file"):
        atomic_write_text("/dev/full", "x")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device
    (tmp_path / "d").mkdir()
    with pytest.raises(TargetError, match="it is a directory"):
        atomic_write_text(tmp_path / "d", "x")


def test_check_target(tmp_path):
    (tmp_path / "old.nc").write_text("keep")
    with pytest.raises(
        TargetError, match="already exists and would be overwritten.*or use --force"
    ):
        check_target(tmp_path / "old.nc", hint="use --force")
    assert check_target(tmp_path / "old.nc", overwrite=True) == str(tmp_path / "old.nc")
    with pytest.raises(TargetError, match="device"):
        check_target("/dev/full", overwrite=True)
    with pytest.raises(TargetError, match="does not exist"):
        check_target(tmp_path / "nodir" / "r.nc")
    with pytest.raises(TargetError, match="not writable"):
        check_target("/proc/r.nc")  # creating a file fails even for root
    assert (tmp_path / "old.nc").read_text() == "keep" and sorted(os.listdir(tmp_path)) == [
        "old.nc"
    ]
    assert unwritable_reason(tmp_path) is None
    assert "is not a directory" in unwritable_reason(tmp_path / "old.nc")
