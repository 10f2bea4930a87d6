"""Which rank a launched process is, read from srun's and torchrun's environments."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from skyfed.agent.cli import main as agent_cli
from skyfed.agent.config import AgentConfig
from skyfed.agent.placement import Placement, detect, first_host
from skyfed.agent.ranks import gpu_index, placed_config

# What srun sets in the second task of a 4-task step on two nodes (captured from Slurm 22.05).
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_STEP_NUM_NODES": "2",
}
TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
}


def test_srun_task_reads_rank_world_local_rank_and_first_node():
    assert detect("auto", SRUN) == Placement(
        launcher="slurm",
        rank=3,
        world=4,
        local_rank=1,
        master_addr="gpu07",
        master_port=29500 + 1234,
        single_host=False,
    )


def test_master_addr_and_port_override_slurms_node_list_and_job_id():
    got = detect("auto", {**SRUN, "MASTER_ADDR": "login1", "MASTER_PORT": "4000"})
    assert (got.master_addr, got.master_port) == ("login1", 4000)


def test_batch_script_outside_srun_is_not_a_rank():
    """The batch step has SLURM_PROCID=0 and the job's SLURM_NTASKS but no step id: an
    `agent start` there spawns its own ranks instead of waiting for tasks that never come."""
    batch = {k: v for k, v in SRUN.items() if k not in ("SLURM_STEP_ID", "SLURM_STEP_NODELIST")}
    assert detect("auto", batch) is None


def test_torchrun_environment_uses_its_agent_store():
    got = detect("auto", TORCHRUN)
    assert (got.launcher, got.rank, got.world, got.local_rank) == ("torchrun", 1, 2, 1)
    assert got.single_host and got.store_is_served


def test_no_launcher_spawns_and_spawn_wins_over_the_environment():
    assert detect("auto", {}) is None
    assert detect("spawn", SRUN) is None


@pytest.mark.parametrize(
    ("launcher", "env", "message"),
    [
        ("slurm", {"SLURM_STEP_ID": "0"}, "SLURM_PROCID is not set"),
        ("slurm", {**SRUN, "SLURM_STEP_ID": None}, "not inside an srun step"),
        ("torchrun", {**TORCHRUN, "RANK": "x"}, "RANK='x' is not an integer"),
        ("torchrun", {**TORCHRUN, "RANK": "2"}, "rank 2 is not in 0..1"),
        ("slurm", {**SRUN, "SLURM_STEP_NODELIST": "gpu[07-", "SLURM_JOB_NODELIST": ""}, "node"),
        ("mpirun", {}, "launcher='mpirun'"),
    ],
)
def test_a_launcher_whose_environment_is_wrong_is_a_clear_error(launcher, env, message):
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        detect(launcher, env)


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("vm", "vm"),
        ("gpu[07-09,12],cpu1", "gpu07"),
        ("a1,b[1-2]", "a1"),
        ("rack[2-3]-n[001-004]", "rack2-n001"),
        ("n[5,1-3]", "n5"),
    ],
)
def test_first_host_of_a_slurm_host_list(nodelist, host):
    assert first_host(nodelist) == host


def test_the_layout_follows_the_launcher_and_a_contrary_one_is_refused(tmp_path):
    config = AgentConfig(cloud="aws", certs=tmp_path)
    placement = detect("auto", SRUN)  # 4 tasks
    assert (placed_config(config, placement).dp, placed_config(config, placement).tp) == (4, 1)
    config.tp = 2
    assert (placed_config(config, placement).dp, placed_config(config, placement).tp) == (2, 2)
    config.tp = 3
    with pytest.raises(ValueError, match="tp=3 does not divide slurm's 4 tasks"):
        placed_config(config, placement)
    config.dp, config.tp = 2, 1
    with pytest.raises(ValueError, match="dp=2 x tp=1 = 2 ranks disagree with slurm's 4 tasks"):
        placed_config(config, placement)


def test_a_rank_takes_the_gpu_of_its_local_rank_or_the_one_bound_to_it():
    placement = detect("auto", SRUN)  # local rank 1
    assert gpu_index(placement, 4) == 1
    assert gpu_index(placement, 1) == 0  # srun --gpus-per-task=1: each task sees one
    assert gpu_index(placement, 0) is None


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (["--tp", "3"], SRUN, "tp=3 does not divide slurm's 4 tasks"),
        (["--dp", "3", "--tp", "2"], SRUN, "dp=3 x tp=2 = 6 ranks disagree with slurm's"),
        (["--launcher", "slurm"], {}, "not inside an srun step"),
    ],
)
def test_agent_start_refuses_a_launch_that_cannot_form_its_site(pki, flags, env, message):
    argv = ["start", "--cloud", "aws", "--certs", str(pki.directory), *flags]
    result = CliRunner().invoke(agent_cli, argv, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_hsdp_shards_within_a_node_by_default_and_a_group_must_divide_the_replicas(tmp_path):
    """Two nodes of four tasks (Slurm says "4(x2)"), TP 2: 4 replicas, 2 on each node, which
    are HSDP's shard groups unless dp_shard says otherwise."""
    env = {**SRUN, "SLURM_NTASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    placement = detect("auto", env)
    assert placement.local_world == 4
    config = AgentConfig(cloud="aws", certs=tmp_path, tp=2, dp_mode="hsdp")
    placed = placed_config(config, placement)
    assert (placed.dp, placed.tp, placed.dp_shard) == (4, 2, 2)
    config.dp_shard = 3
    with pytest.raises(ValueError, match="dp_shard=3 does not divide dp=4"):
        placed_config(config, placement)
    torchrun = {**TORCHRUN, "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert detect("auto", torchrun).local_world == 4
