"""tests/integration/podman.py's cache under /var/tmp: used only when it is our own, and a base
image store made again when its tarball was."""

from __future__ import annotations

import os

import pytest

from tests.integration.podman import PodmanUnavailable, tarball_identity, trusted_root


def test_directories_of_our_own_are_made_and_accepted(tmp_path):
    root = tmp_path / "root"
    trusted_root((root, root / "base-images"))
    assert (root / "base-images").is_dir()
    trusted_root((root, root / "base-images"))  # and accepted again once they exist


@pytest.mark.parametrize("plant", ["writable by others", "a symlink", "another user's"])
def test_a_directory_someone_else_could_have_planted_is_refused(tmp_path, plant):
    root = tmp_path / "root"
    if plant == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        root.symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir()
        if plant == "writable by others":
            root.chmod(0o777)
        else:
            os.chown(root, 65534, 65534)
    with pytest.raises(PodmanUnavailable, match=f"{root} is not a directory of uid {os.geteuid()}"):
        trusted_root((root,))


def test_a_tarball_made_again_under_the_same_name_is_another_one(tmp_path):
    tarball = tmp_path / "python-key.tar"
    tarball.write_bytes(b"first")
    first = tarball_identity(tarball)
    assert tarball_identity(tarball) == first
    tarball.unlink()
    tarball.write_bytes(b"again")
    assert tarball_identity(tarball) != first
