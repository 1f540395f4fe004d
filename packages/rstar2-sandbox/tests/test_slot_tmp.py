"""``SlotTmp``: a slot's namespace is kept while its runs leave nothing, replaced when one does."""

from __future__ import annotations

import os

import pytest

from rstar2_sandbox.executor.slot_tmp import SlotTmp
from rstar2_sandbox.executor.syscalls import CLONE_NEWNS, setns

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces need root here")


def test_slot_tmp_keeps_a_clean_namespace_and_replaces_a_dirty_one() -> None:
    slot = SlotTmp(4, 1, [])

    def run(files: list[str]) -> None:
        """A stand-in run: enters the slot, makes its working directory and ``files``."""
        pid = os.fork()
        if pid == 0:
            try:
                setns(slot.ns_fd, CLONE_NEWNS)
                os.mkdir("/tmp/run-x")
                for name in files:
                    with open(name, "w") as handle:
                        handle.write("x")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    try:
        namespace = os.fstat(slot.ns_fd).st_ino
        run([])
        assert slot.reset("run-x")
        assert os.fstat(slot.ns_fd).st_ino == namespace  # kept
        run(["/dev/shm/left"])
        assert not slot.reset("run-x")
        assert os.listdir(slot.shm_fd) == []  # a new, empty one
        run(["/tmp/run-x/left"])
        assert not slot.reset("run-x")
        assert os.listdir(slot.tmp_fd) == []
        run([])
        assert slot.reset("run-x")
    finally:
        slot.close()


def test_a_closed_slot_is_made_again_for_its_next_run() -> None:
    slot = SlotTmp(4, 1, [])
    try:
        slot.close()  # as after a failed attempt to replace a dirty namespace
        assert slot.ns_fd == -1
        ns_fd = slot.ensure()
        assert ns_fd >= 0
        assert os.listdir(slot.tmp_fd) == []
        assert slot.ensure() == ns_fd  # kept once made
    finally:
        slot.close()
