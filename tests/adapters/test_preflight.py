"""The adapters' own doctor checks (`preflight`) against the real sshd and Slurm on 127.0.0.1:
they answer without installing, submitting or launching anything."""

from __future__ import annotations

from pathlib import Path

from adapters.compute import LaunchSpec
from adapters.preflight import Outcome
from adapters.slurm import SlurmAdapter
from adapters.ssh import SshAdapter
from tests.adapters.conftest import Slurm, Sshd, free_port

SPEC = LaunchSpec(job="train", run_id="doctor", epoch=0, command=["true"])


def test_ssh_preflight_logs_in_to_each_host_and_names_the_one_that_does_not_answer(sshd: Sshd,
                                                                                   tmp_path: Path) -> None:
    dead = sshd.host("dead").model_copy(update={"port": free_port()})
    adapter = SshAdapter("ssh", sshd.settings(tmp_path / "wd", hosts=[sshd.host(), dead]), owner="repo-a")
    checks = {c.what: c for c in adapter.preflight([SPEC])}
    assert checks["host box"].outcome is Outcome.OK and "Python 3" in checks["host box"].detail
    assert checks["host dead"].outcome is Outcome.FAIL and "dead" in checks["host dead"].detail
    assert not (tmp_path / "wd").exists()  # nothing was installed on the host


def test_slurm_preflight_asks_sinfo_for_the_partitions(slurm: Slurm, tmp_path: Path) -> None:
    adapter = SlurmAdapter("slurm", slurm.settings(tmp_path / "wd"), owner="repo-a")
    [check] = adapter.preflight([SPEC])
    assert check.outcome is Outcome.OK and "debug" in check.detail
