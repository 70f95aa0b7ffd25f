import os

import pytest

from gpt.runtime.files import atomic_write


def test_atomic_write_replaces_only_when_complete(tmp_path):
    path = tmp_path / "f.bin"
    with atomic_write(path) as f:
        f.write(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write(b"half a new fi")
            raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]  # the temp file is gone
    with atomic_write(path, "w") as f:
        f.write("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["f.bin"]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as open() would make it, not mkstemp's 0600


def test_a_link_at_the_path_is_replaced_never_written_through(tmp_path):
    target, other = tmp_path / "elsewhere.pt", tmp_path / "other-name.pt"
    target.write_bytes(b"keep me")
    other.write_bytes(b"keep me too")
    (tmp_path / "ckpt.pt").symlink_to(target)
    os.link(other, tmp_path / "ckpt-hard.pt")  # one file, two names
    for name in ("ckpt.pt", "ckpt-hard.pt"):
        with atomic_write(tmp_path / name) as f:
            f.write(b"new")
        assert not os.path.islink(tmp_path / name) and (tmp_path / name).read_bytes() == b"new"
    assert target.read_bytes() == b"keep me" and other.read_bytes() == b"keep me too"


def test_the_temporary_file_is_always_a_new_one(tmp_path, monkeypatch):
    import tempfile
    # names the folder already has, as a link and a file: mkstemp (O_EXCL) moves on to a name nobody has
    names = iter(["taken", "linked", "free"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (tmp_path / "f.bin.taken.tmp").write_bytes(b"someone's")
    (tmp_path / "f.bin.linked.tmp").symlink_to(victim)
    with atomic_write(tmp_path / "f.bin") as f:
        f.write(b"data")
    assert (tmp_path / "f.bin").read_bytes() == b"data" and victim.read_bytes() == b"untouched"
    assert (tmp_path / "f.bin.taken.tmp").read_bytes() == b"someone's"
