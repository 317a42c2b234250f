"""Ranks from Slurm's variables under `srun`: the compressed node lists Slurm writes, and which of
torchrun's variables are derived from Slurm's (torchrun's own, when present, win)."""

from __future__ import annotations

import pytest

from reconciler.worker.dist import SLURM_PORT_BASE, hostnames, slurm_env


@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("node7", ["node7"]),
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("gpu[008-010],login-2", ["gpu008", "gpu009", "gpu010", "login-2"]),
    ("a[1-2]-ib,b", ["a1-ib", "a2-ib", "b"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("", []),
])
def test_slurm_node_lists_expand_as_scontrol_show_hostnames_does(nodelist: str, hosts: list[str]) -> None:
    assert hostnames(nodelist) == hosts


def test_a_node_list_that_is_not_slurm_s_form_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"node list 'n\[a-b\]'"):
        hostnames("n[a-b]")


SRUN_TASK = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4",
             "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-09]"}


def test_an_srun_task_gets_rank_world_local_rank_and_a_rendezvous_on_the_step_s_first_host() -> None:
    assert slurm_env(SRUN_TASK) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07",
                                    "MASTER_PORT": str(SLURM_PORT_BASE + 4242)}
    job_only = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_NODELIST"}
    assert slurm_env(job_only)["MASTER_ADDR"] == "gpu07"


def test_torchrun_s_variables_and_an_explicit_rendezvous_win_over_slurm_s() -> None:
    assert slurm_env({**SRUN_TASK, "WORLD_SIZE": "8", "RANK": "5"}) == {}  # torchrun started by srun
    derived = slurm_env({**SRUN_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert "MASTER_ADDR" not in derived and "MASTER_PORT" not in derived and derived["RANK"] == "3"


def test_the_batch_step_and_single_task_steps_are_not_distributed() -> None:
    batch_step = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_NUM_TASKS"}  # sbatch --ntasks=4, no srun
    assert slurm_env(batch_step) == {}
    assert slurm_env({**SRUN_TASK, "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) == {}
    assert slurm_env({}) == {}
