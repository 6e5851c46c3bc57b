"""Consumer path containment (§15.21a.5): all six steps, including TOCTOU swaps."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from tensorpool.counters import Reason
from tensorpool.shm import PathPolicy, PathRejected


def _file(path: str, data: bytes = b"x" * 64) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _reason(policy: PathPolicy, path: str, **kw: bool) -> str:
    with pytest.raises(PathRejected) as info:
        fd, _ = policy.open(path, **kw)
        os.close(fd)
    return info.value.reason


@pytest.fixture
def base(shm_base: str) -> str:
    d = os.path.join(shm_base, "base")
    os.mkdir(d)
    return d


def test_s15_21a_5_contained_regular_file_opens_with_identity(base: str) -> None:
    path = _file(os.path.join(base, "ns", "header.ring"))
    policy = PathPolicy([base])
    fd, validated = policy.open(path)
    try:
        st = os.fstat(fd)
        assert stat.S_ISREG(st.st_mode)
        assert (st.st_dev, st.st_ino) == (validated.st_dev, validated.st_ino)
        assert validated.canonical == os.path.realpath(path)
        assert os.get_blocking(fd)
    finally:
        os.close(fd)


def test_s15_21a_5_step1_relative_path_rejected(base: str) -> None:
    _file(os.path.join(base, "f"))
    policy = PathPolicy([base])
    assert _reason(policy, "base/f") == Reason.PATH_NOT_ABSOLUTE
    assert _reason(policy, "") == Reason.PATH_NOT_ABSOLUTE


def test_s15_21a_5_step2_missing_file_rejected(base: str) -> None:
    assert _reason(PathPolicy([base]), os.path.join(base, "nope")) == Reason.PATH_NOT_FOUND


def test_s15_21a_5_step2_dotdot_segments_resolved_before_containment(
    base: str, shm_base: str
) -> None:
    outside = _file(os.path.join(shm_base, "outside.pool"))
    inside = _file(os.path.join(base, "a", "inside.pool"))
    policy = PathPolicy([base])
    # '..' escaping the base is resolved first, then refused.
    assert _reason(policy, os.path.join(base, "a", "..", "..", "outside.pool")) == (
        Reason.PATH_OUTSIDE_ALLOWED_BASE
    )
    assert os.path.exists(outside)
    # '..' that stays inside is fine and canonicalised.
    fd, v = policy.open(os.path.join(base, "a", "..", "a", "inside.pool"))
    os.close(fd)
    assert v.canonical == inside


def test_s15_21a_5_step2_symlink_escaping_base_rejected(base: str, shm_base: str) -> None:
    target = _file(os.path.join(shm_base, "secret"))
    link = os.path.join(base, "header.ring")
    os.symlink(target, link)
    assert _reason(PathPolicy([base]), link) == Reason.PATH_OUTSIDE_ALLOWED_BASE


def test_s15_21a_5_step2_symlinked_directory_escaping_base_rejected(
    base: str, shm_base: str
) -> None:
    other = os.path.join(shm_base, "elsewhere")
    _file(os.path.join(other, "x.pool"))
    os.symlink(other, os.path.join(base, "epoch-1"))
    assert _reason(PathPolicy([base]), os.path.join(base, "epoch-1", "x.pool")) == (
        Reason.PATH_OUTSIDE_ALLOWED_BASE
    )


def test_s15_21a_5_step2_symlink_inside_base_is_followed_to_canonical(base: str) -> None:
    target = _file(os.path.join(base, "real.pool"))
    link = os.path.join(base, "alias.pool")
    os.symlink(target, link)
    fd, v = PathPolicy([base]).open(link)
    os.close(fd)
    assert v.canonical == target  # the no-follow open uses the canonical path


def test_s15_21a_5_step3_base_dirs_canonicalised_once(shm_base: str) -> None:
    real = os.path.join(shm_base, "real")
    os.mkdir(real)
    alias = os.path.join(shm_base, "alias")
    os.symlink(real, alias)
    path = _file(os.path.join(real, "f"))
    policy = PathPolicy([alias, alias + "/"])
    assert policy.allowed_base_dirs == (real,)
    # Re-pointing the configured alias later does not change the policy.
    os.remove(alias)
    os.symlink(shm_base, alias)
    assert policy.allowed_base_dirs == (real,)
    assert _reason(policy, _file(os.path.join(shm_base, "g"))) == Reason.PATH_OUTSIDE_ALLOWED_BASE
    fd, _ = policy.open(path)
    os.close(fd)


def test_s15_21a_5_step3_relative_base_refused() -> None:
    with pytest.raises(ValueError):
        PathPolicy(["relative/base"])


def test_s15_21a_5_step4_common_string_prefix_is_not_containment(shm_base: str) -> None:
    base = os.path.join(shm_base, "base")
    sibling = os.path.join(shm_base, "base2")
    os.mkdir(base)
    path = _file(os.path.join(sibling, "header.ring"))
    assert _reason(PathPolicy([base]), path) == Reason.PATH_OUTSIDE_ALLOWED_BASE


def test_s15_21a_5_step4_empty_allow_list_allows_nothing(base: str) -> None:
    path = _file(os.path.join(base, "f"))
    assert _reason(PathPolicy([]), path) == Reason.PATH_OUTSIDE_ALLOWED_BASE


def test_s15_21a_5_step4_any_of_several_bases(shm_base: str) -> None:
    a, b = os.path.join(shm_base, "a"), os.path.join(shm_base, "b")
    os.mkdir(a)
    path = _file(os.path.join(b, "f"))
    fd, _ = PathPolicy([a, b]).open(path)
    os.close(fd)


def test_s15_21a_5_step5_directory_rejected(base: str) -> None:
    d = os.path.join(base, "dir.pool")
    os.mkdir(d)
    assert _reason(PathPolicy([base]), d) == Reason.PATH_NOT_REGULAR_FILE


def test_s15_21a_5_step5_fifo_rejected_without_blocking(base: str) -> None:
    fifo = os.path.join(base, "header.ring")
    os.mkfifo(fifo)
    assert _reason(PathPolicy([base]), fifo) == Reason.PATH_NOT_REGULAR_FILE


def test_s15_21a_5_step5_socket_rejected(base: str) -> None:
    path = os.path.join(base, "s.sock")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(path)
        assert _reason(PathPolicy([base]), path) == Reason.PATH_NOT_REGULAR_FILE
    finally:
        sock.close()


def test_s15_21a_5_step5_character_device_rejected() -> None:
    # /dev/null is a character device: allow /dev so only the file-type rule can refuse it.
    assert _reason(PathPolicy(["/dev"]), "/dev/null") == Reason.PATH_NOT_REGULAR_FILE


def test_s15_21a_5_step6_file_swapped_for_symlink_after_validation(
    base: str, shm_base: str
) -> None:
    path = _file(os.path.join(base, "header.ring"))
    policy = PathPolicy([base])
    validated = policy.validate(path)
    target = _file(os.path.join(shm_base, "evil"))
    os.remove(path)
    os.symlink(target, path)
    with pytest.raises(PathRejected) as info:
        policy.open_validated(validated)
    assert info.value.reason == Reason.PATH_OPEN_FAILED  # O_NOFOLLOW: ELOOP


def test_s15_21a_5_step6_file_replaced_by_other_file_after_validation(base: str) -> None:
    path = _file(os.path.join(base, "header.ring"))
    policy = PathPolicy([base])
    validated = policy.validate(path)
    tmp = _file(os.path.join(base, "replacement"))
    os.replace(tmp, path)  # same name, different inode
    with pytest.raises(PathRejected) as info:
        policy.open_validated(validated)
    assert info.value.reason == Reason.PATH_IDENTITY_CHANGED


def test_s15_21a_5_step6_file_swapped_for_fifo_after_validation(base: str) -> None:
    path = _file(os.path.join(base, "header.ring"))
    policy = PathPolicy([base])
    validated = policy.validate(path)
    os.remove(path)
    os.mkfifo(path)
    with pytest.raises(PathRejected) as info:
        policy.open_validated(validated)  # O_NONBLOCK: returns instead of waiting for a writer
    assert info.value.reason == Reason.PATH_NOT_REGULAR_FILE


def test_s15_21a_5_step6_directory_swapped_for_symlink_after_validation(
    base: str, shm_base: str
) -> None:
    path = _file(os.path.join(base, "epoch-1", "x.pool"))
    policy = PathPolicy([base])
    validated = policy.validate(path)
    decoy = os.path.join(shm_base, "decoy")
    _file(os.path.join(decoy, "x.pool"))
    os.rename(os.path.join(base, "epoch-1"), os.path.join(base, "moved"))
    os.symlink(decoy, os.path.join(base, "epoch-1"))
    with pytest.raises(PathRejected) as info:
        policy.open_validated(validated)
    assert info.value.reason == Reason.PATH_IDENTITY_CHANGED


def test_s15_21a_5_file_removed_after_validation(base: str) -> None:
    path = _file(os.path.join(base, "header.ring"))
    policy = PathPolicy([base])
    validated = policy.validate(path)
    os.remove(path)
    with pytest.raises(PathRejected) as info:
        policy.open_validated(validated)
    assert info.value.reason == Reason.PATH_OPEN_FAILED


def test_writable_open(base: str) -> None:
    path = _file(os.path.join(base, "f"))
    fd, _ = PathPolicy([base]).open(path, writable=True)
    try:
        os.pwrite(fd, b"ok", 0)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read(2) == b"ok"
