"""CPU partitions (rl_runner.partition): what auto chooses, what a written partition means,
and the bad input refused before anything starts."""

import pytest

from envkit.errors import UserError
from envkit.sandbox import SandboxLimits
from envkit.sandbox.limits import limit_options
from rl_runner.partition import cpu_list, describe, format_cpus, plan_partition

TWO, SIXTEEN = (0, 1), tuple(range(16))


def test_core_lists_read_and_write_back():
    assert cpu_list("0-3,6") == (0, 1, 2, 3, 6) and cpu_list("1") == (1,) and cpu_list("2,0,1") == (0, 1, 2)
    assert format_cpus((0, 1, 2, 5)) == "0-2,5" and format_cpus([3]) == "3"
    for bad in ("", "a", "3-1", "1-", "-2", "1;2", "0-99999999999"):  # a huge range is refused, not expanded
        with pytest.raises(ValueError):
            cpu_list(bad)


def test_auto_on_two_cores_gives_one_replica_a_core_and_the_sandboxes_the_other():
    p = plan_partition("auto", None, gpu=False, available=TWO)
    assert p.active and p.replicas == 1 and p.bind(0) == "0" and p.affinity(0) == {0} and p.cpuset() == "1"
    assert describe(p.to_dict()) == "cores: inference 0 (replica 0: 0), sandboxes 1 (auto)"


def test_auto_on_sixteen_cores_splits_inference_between_two_replicas():
    p = plan_partition("auto", None, gpu=False, available=SIXTEEN)
    assert [p.bind(k) for k in range(p.replicas)] == ["0-3", "4-7"] and p.cpuset() == "8-15"
    p = plan_partition("auto", 3, gpu=False, available=SIXTEEN)
    assert [p.bind(k) for k in range(3)] == ["0-2", "3-5", "6-7"]
    p = plan_partition("auto", 12, gpu=False, available=SIXTEEN)  # one core each, the rest to sandboxes
    assert p.replicas == 12 and p.bind(11) == "11" and p.cpuset() == "12-15"


def test_auto_shares_the_cores_when_a_partition_does_not_fit_or_does_not_apply_and_says_why():
    p = plan_partition("auto", 2, gpu=False, available=TWO)
    assert not p.active and p.cpuset() is None and [p.bind(0), p.bind(1)] == ["0", "1"]  # still one core each
    assert "none left for sandboxes" in p.how and p.affinity(0) is None
    assert not plan_partition("auto", None, gpu=False, available=(0,)).active
    gpu = plan_partition("auto", 2, gpu=True, available=SIXTEEN)
    assert not gpu.active and gpu.bind(0) is None and "CUDA" in gpu.how
    remote = plan_partition("auto", None, gpu=False, available=SIXTEEN, remote_sandboxes=True)
    assert not remote.active and "cluster" in remote.how
    none = plan_partition("none", 1, gpu=False, available=SIXTEEN)
    assert not none.active and none.bind(0) is None
    assert describe(none.to_dict()) == "cores: shared by inference and sandboxes (--cpu-partition none)"


def test_a_written_partition_is_taken_as_given():
    p = plan_partition("0-1/2-3", None, gpu=False, available=(0, 1, 2, 3))
    assert [p.bind(0), p.bind(1)] == ["0", "1"] and p.cpuset() == "2-3" and p.how == "given"
    p = plan_partition(" 0,2 / 1,3 ", 1, gpu=False, available=(0, 1, 2, 3))
    assert p.bind(0) == "0,2" and p.cpuset() == "1,3"


@pytest.mark.parametrize("spec, replicas, says", [
    ("0-1/", None, "leaves no core for the sandboxes"),
    ("/1", None, "leaves no core for inference"),
    ("0/1", 2, "2 vLLM replicas need a core each"),
    ("0-1/1", None, "on both sides"),
    ("0/7", None, "not available here"),
    ("0,1", None, "INFERENCE/SANDBOXES"),
    ("zero/one", None, "is not a core or range"),
    ("0-99999999999/1", None, "is not a core or range"),
    ("auto", 0, "at least one vLLM replica"),
])
def test_bad_partitions_are_refused_with_what_to_do(spec, replicas, says):
    with pytest.raises(UserError) as e:
        plan_partition(spec, replicas, gpu=False, available=TWO)
    assert says in e.value.message and e.value.hint


def test_a_written_partition_is_refused_when_the_sandboxes_are_on_a_remote_cluster():
    with pytest.raises(UserError, match="cluster"):
        plan_partition("0/1", None, gpu=False, available=TWO, remote_sandboxes=True)


def test_the_sandboxes_cpuset_reaches_the_container_options():
    assert limit_options(SandboxLimits(cpuset="1"))["cpuset_cpus"] == "1"
    assert "cpuset_cpus" not in limit_options(SandboxLimits())
