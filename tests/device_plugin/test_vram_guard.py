"""The VRAM guard: containers past their VRAM limit by the driver's count (the judgement, table-tested), the
pidfd killer on real processes of this machine, the fake GPU's scripted processes killed, and the whole loop
in the real plugin assembly: a container scripted past its limit loses its process, its neighbour keeps its
own, and the pod and the node get the Event."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from device_plugin.cluster.node_events import REASON_VRAM_OVERUSE
from device_plugin.daemon import Daemon
from device_plugin.enforcement.vram_guard import VramGuard
from device_plugin.enforcement.vram_overuse import PASSES, Outcome, Overuse, OveruseAction, judge
from device_plugin.gpus.fake_probe import FAKE_PID_BASE, FakeProbe
from device_plugin.metrics import PluginMetrics
from device_plugin.settings import PluginSettings
from device_plugin.usage.process_kill import KillRefused, PidfdKiller
from device_plugin.usage.process_owner import ProcessOwner
from device_plugin.usage.usage import Attribution, Holder, HolderKey
from tests.device_plugin.fakes import GIB, GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.harness import plugin, run, until
from vgpu.contract.usage import ContainerUsage, NodeUsage, PodGpu
from vgpu.metric_names import VRAM_OVERUSE

MIB = 1024 * 1024
TOLERANCE = 512 * MIB
OWNER = ProcessOwner(pod="uid-a", container_id="cid-a")


def row(used: int, limit: int = 4 * GIB, *, container: str = "main", gpu: str = GPU0) -> ContainerUsage:
    return ContainerUsage(
        namespace="team-a",
        pod="trainer",
        pod_uid="uid-a",
        container=container,
        gpu=gpu,
        tflops_used=0,
        vram_used=used,
        tflops_measured=True,
        tflops_request=0,
        tflops_limit=0,
        vram_request=limit,
        vram_limit=limit,
    )


def key(c: ContainerUsage) -> HolderKey:
    return (c.pod_uid, c.container, c.gpu)


def holders(c: ContainerUsage, *sizes: tuple[int, int]) -> dict[HolderKey, tuple[Holder, ...]]:
    """(pid, bytes) each, as the pass attributed them to row ``c``."""
    return {key(c): tuple(Holder(pid=pid, owner=OWNER, memory=size) for pid, size in sizes)}


def passes(
    rows: list[ContainerUsage], procs: Mapping[HolderKey, tuple[Holder, ...]], count: int, *, again: bool
) -> list[list[int]]:
    """The victims' PIDs after each of ``count`` identical passes."""
    streaks: Mapping[PodGpu, int] = {}
    acted = []
    for _ in range(count):
        found = judge(rows, procs, tolerance=TOLERANCE, streaks=streaks, again=again)
        streaks = found.streaks
        acted.append([o.victim.pid for o in found.act])
    return acted


# --- the judgement -----------------------------------------------------------------------------------------


def test_a_container_past_its_limit_and_the_tolerance_loses_its_largest_process_on_the_second_pass_in_a_row() -> None:
    over = row(4 * GIB + TOLERANCE + 1)
    procs = holders(over, (10, GIB), (11, 3 * GIB + TOLERANCE + 1), (12, 0))
    assert passes([over], procs, 2, again=True) == [[], [11]]


@pytest.mark.parametrize(
    ("used", "limit"),
    [
        pytest.param(4 * GIB, 4 * GIB, id="at-its-limit"),
        pytest.param(4 * GIB + TOLERANCE, 4 * GIB, id="within-the-tolerance"),
        pytest.param(80 * GIB, 0, id="no-vram-limit"),
    ],
)
def test_a_container_within_its_limit_and_the_tolerance_or_without_a_limit_is_left_alone(used: int, limit: int) -> None:
    c = row(used, limit)
    assert passes([c], holders(c, (10, used)), 4, again=True) == [[], [], [], []]


def test_one_pass_under_the_limit_between_two_over_it_starts_the_count_again() -> None:
    over, under = row(6 * GIB), row(GIB)
    procs = holders(over, (10, 6 * GIB))
    first = judge([over], procs, tolerance=TOLERANCE, streaks={}, again=True)
    between = judge([under], holders(under, (10, GIB)), tolerance=TOLERANCE, streaks=first.streaks, again=True)
    assert between.streaks == {}
    after = judge([over], procs, tolerance=TOLERANCE, streaks=between.streaks, again=True)
    assert (first.act, between.act, after.act) == ((), (), ())


def test_killing_acts_again_every_two_passes_while_it_stays_over_and_reporting_once_while_it_stays_over() -> None:
    over = row(6 * GIB)
    procs = holders(over, (10, 6 * GIB))
    assert passes([over], procs, 6, again=True) == [[], [10], [], [10], [], [10]]
    assert passes([over], procs, 6, again=False) == [[], [10], [], [], [], []]


def test_each_pod_and_gpu_is_judged_on_its_own_and_ties_go_to_the_younger_process() -> None:
    a, b = row(6 * GIB), row(GIB, gpu=GPU1)
    c = replace(row(6 * GIB), pod="other", pod_uid="uid-b")
    procs = {**holders(a, (10, 3 * GIB), (12, 3 * GIB)), **holders(b, (30, GIB)), **holders(c, (20, 6 * GIB))}
    assert passes([a, b, c], procs, 2, again=True) == [[], [12, 20]]


def test_a_pods_containers_on_one_gpu_are_held_to_its_limit_together_each_within_it_alone() -> None:
    """The ledger books a pod's grant once, however many of its containers see the GPU (``inject-container``
    naming several): three containers each at 3Gi under a 4Gi limit hold 9Gi, and lose their largest process
    first, then the next largest (a tie: the younger) two passes later; the one left is within the limit."""
    rows = [row(3 * GIB, container=name) for name in ("prep", "serve", "side")]
    rows[1] = replace(rows[1], vram_used=3 * GIB + MIB)
    procs = {
        **holders(rows[0], (10, 3 * GIB)),
        **holders(rows[1], (20, 3 * GIB + MIB)),
        **holders(rows[2], (30, 3 * GIB)),
    }
    assert passes(rows, procs, 2, again=True) == [[], [20]]
    assert passes([rows[0], rows[2]], procs, 2, again=True) == [[], [30]]
    assert passes([rows[0]], procs, 4, again=True) == [[], [], [], []]
    # The same rows as three pods of one container each: each within its own limit.
    apart = [replace(r, pod_uid=f"uid-{r.container}") for r in rows]
    apart_procs = {(f"uid-{c}", c, g): v for (_, c, g), v in procs.items()}
    assert passes(apart, apart_procs, 4, again=True) == [[], [], [], []]


def test_the_message_names_the_container_the_figures_and_what_was_done() -> None:
    over = Overuse(rows=(row(6 * GIB),), container="main", victim=Holder(pid=4242, owner=OWNER, memory=5 * GIB))
    killed = over.message(TOLERANCE, Outcome.KILLED)
    assert killed == (
        f"container main of pod team-a/trainer held 6Gi of GPU {GPU0} by the driver's count, over the pod's VRAM "
        f"limit 4Gi by more than 512Mi in {PASSES} samples in a row: its process 4242 (5Gi) was killed"
    )
    assert over.message(TOLERANCE, Outcome.KILL_FAILED, "no KILL").endswith("could not be killed: no KILL")
    assert over.message(TOLERANCE, Outcome.GONE).endswith("its process 4242 (5Gi) had exited")
    assert over.message(TOLERANCE, Outcome.REPORTED).endswith(
        "the largest holder is its process 4242 (5Gi); reported only (--vram-overuse=report)"
    )


def test_the_message_of_several_containers_names_each_ones_use_and_the_victims_container() -> None:
    rows = (row(3 * GIB, container="prep"), row(2 * GIB, container="serve"))
    over = Overuse(rows=rows, container="prep", victim=Holder(pid=7, owner=OWNER, memory=3 * GIB))
    assert over.message(TOLERANCE, Outcome.KILLED) == (
        f"pod team-a/trainer's containers prep (3Gi), serve (2Gi) together held 5Gi of GPU {GPU0} by the driver's "
        f"count, over the pod's VRAM limit 4Gi by more than 512Mi in {PASSES} samples in a row: process 7 (3Gi) "
        "of prep was killed"
    )


# --- the guard's acts ---------------------------------------------------------------------------------------


class Killer:
    """Records each kill; ``refuse`` raises, ``exited`` answers as for a process already gone."""

    def __init__(self, *, refuse: str = "", exited: bool = False) -> None:
        self.killed: list[tuple[int, ProcessOwner]] = []
        self._refuse, self._exited = refuse, exited

    def kill(self, pid: int, owner: ProcessOwner) -> bool:
        if self._refuse:
            raise KillRefused(self._refuse)
        self.killed.append((pid, owner))
        return not self._exited


def attribution(c: ContainerUsage, procs: Mapping[HolderKey, tuple[Holder, ...]]) -> Attribution:
    usage = NodeUsage(node="n", sampled_at="2026-11-28T12:00:00.000Z", interval_s=5, containers=(c,))
    return Attribution(usage=usage, skipped=(), holders=procs)


def guarded(action: OveruseAction, killer: Killer) -> tuple[list[str], dict[str, float]]:
    """Four passes of one container over its limit: the messages reported, and the counter by outcome."""
    metrics, reports = PluginMetrics(), []
    guard = VramGuard(action, TOLERANCE, killer, metrics, lambda found, message: reports.append(message))
    over = row(6 * GIB)
    found = attribution(over, holders(over, (4242, 6 * GIB)))

    async def four() -> None:
        for _ in range(4):
            await guard.enforce(found)

    run(four())
    counts = {
        o.value: metrics.registry.get_sample_value("tf_device_plugin_vram_overuse_total", {"outcome": o.value})
        for o in Outcome
    }
    return reports, {k: v for k, v in counts.items() if v}


def test_the_guard_kills_counts_and_reports_each_act() -> None:
    killer = Killer()
    reports, counts = guarded(OveruseAction.KILL, killer)
    assert killer.killed == [(4242, OWNER), (4242, OWNER)]
    assert counts == {"killed": 2}
    assert len(reports) == 2 and all(r.endswith("its process 4242 (6Gi) was killed") for r in reports)


def test_report_only_kills_nothing_and_reports_once_and_off_does_nothing() -> None:
    killer = Killer()
    reports, counts = guarded(OveruseAction.REPORT, killer)
    assert (killer.killed, counts, len(reports)) == ([], {"reported": 1}, 1)
    assert guarded(OveruseAction.OFF, killer) == ([], {})


def test_a_kill_refused_or_of_a_process_gone_is_counted_as_such_and_says_why() -> None:
    reports, counts = guarded(OveruseAction.KILL, Killer(refuse="needs the KILL capability"))
    assert counts == {"kill_failed": 1}  # said once for that process, not again every two passes
    assert len(reports) == 1 and reports[0].endswith("could not be killed: needs the KILL capability")
    assert guarded(OveruseAction.KILL, Killer(exited=True))[1] == {"gone": 2}


def test_every_outcome_is_exported_at_0_from_the_start() -> None:
    metrics = PluginMetrics()
    for o in Outcome:
        assert metrics.registry.get_sample_value("tf_device_plugin_vram_overuse_total", {"outcome": o.value}) == 0


# --- the pidfd killer, on real processes ---------------------------------------------------------------------


class Owners:
    def __init__(self, owners: Mapping[int, ProcessOwner]) -> None:
        self.owners = dict(owners)

    def owner(self, pid: int) -> ProcessOwner | None:
        return self.owners.get(pid)


def test_the_pidfd_killer_kills_a_process_that_still_has_its_owner_and_no_other() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = ProcessOwner(pod="uid-b", container_id="cid-b")
        killer = PidfdKiller(Owners({child.pid: other}))
        with pytest.raises(KillRefused, match="belongs to another container by now"):
            killer.kill(child.pid, OWNER)
        assert child.poll() is None
        assert PidfdKiller(Owners({child.pid: OWNER})).kill(child.pid, OWNER) is True
        assert child.wait(10) == -signal.SIGKILL
        assert PidfdKiller(Owners({child.pid: OWNER})).kill(child.pid, OWNER) is False  # reaped: gone
    finally:
        child.kill()
        child.wait()


def test_the_pidfd_killer_leaves_a_process_no_owner_is_found_for_and_says_when_not_permitted() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert PidfdKiller(Owners({})).kill(child.pid, OWNER) is False  # exited in between, as far as /proc says
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def refusal_as_nobody(target: int) -> str:
    """What the killer says of ``target``, run in a child that has become nobody (without CAP_KILL)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork beside threads: the child only signals and exits
        child = os.fork()
    if child == 0:
        said = "sent"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            PidfdKiller(Owners({target: OWNER})).kill(target, OWNER)
        except KillRefused as exc:
            said = str(exc)
        finally:
            os.write(write, said.encode())
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as answer:
        return answer.read()


def test_the_pidfd_killer_says_so_when_it_may_not_signal_another_users_process() -> None:
    """As root the killer runs as nobody against a root process; otherwise against init."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if os.geteuid() == 0:
            said = refusal_as_nobody(child.pid)
        else:
            with pytest.raises(KillRefused) as refused:
                PidfdKiller(Owners({1: OWNER})).kill(1, OWNER)
            said = str(refused.value)
        target = child.pid if os.geteuid() == 0 else 1
        assert said == f"not permitted to signal process {target}: the device plugin needs the KILL capability"
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


# --- the fake GPU's scripted processes ----------------------------------------------------------------------


def test_a_killed_scripted_process_leaves_the_reports_until_the_file_is_written_again(tmp_path: Path) -> None:
    entries = [
        {"pod": "trainer", "container": "main", "gpu": 0, "vramMiB": 2048},
        {"pod": "other", "container": "main", "gpu": 0, "vramMiB": 512},
    ]
    path = gpu_file(tmp_path / "gpus.yaml", usage=entries)
    probe = FakeProbe(path)
    owner = ProcessOwner(pod="trainer", container="main")
    with pytest.raises(KillRefused, match="belongs to another container"):
        probe.kill(FAKE_PID_BASE + 1, owner)
    assert probe.kill(FAKE_PID_BASE, owner) is True
    assert [p.pid for p in probe.processes(GPU0, 0).processes] == [FAKE_PID_BASE + 1]
    assert probe.owner(FAKE_PID_BASE) is None
    assert probe.kill(FAKE_PID_BASE, owner) is False
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))  # written again
    assert [p.pid for p in probe.processes(GPU0, 0).processes] == [FAKE_PID_BASE, FAKE_PID_BASE + 1]


# --- the whole loop in the plugin ---------------------------------------------------------------------------


def test_in_the_plugin_a_container_past_its_limit_loses_its_process_and_its_neighbour_keeps_its_own(
    tmp_path: Path,
) -> None:
    """Two pods granted 4 GiB of GPU0: one scripted at 6 GiB (past 4 GiB + 512 MiB), one at 4.5 GiB (within
    the tolerance). Sampling every 50 ms, without /metrics (--metrics-port=0): the guard runs anyway."""
    pods = [make_pod(name, namespace="ml", alloc=None, phase="Running") for name in ("greedy", "modest")]
    for pod in pods:
        pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = allocation(
            uid_of(pod), gpus=(grant(GPU0, vram=4 * GIB),)
        )
    kube = FakeKube(pods)
    path = gpu_file(tmp_path / "gpus.yaml")

    async def scenario() -> None:
        async with plugin(tmp_path, kube, path, usage_interval=0.05) as (daemon, _):
            gpu_file(
                path,
                usage=[
                    {"pod": "greedy", "container": "main", "gpu": 0, "vramMiB": 6144},
                    {"pod": "modest", "container": "main", "gpu": 0, "vramMiB": 4608},
                ],
            )
            await until(lambda: kube.pod_events and kube.node_events, timeout=10)
            await asyncio.sleep(0.3)  # six more passes: nothing else is killed
            await daemon.node_events.drain()
            assert daemon.probe.processes(GPU0, 0).processes[0].pid == FAKE_PID_BASE + 1  # the modest one's
            ((ns, name, uid, reason, message, warning),) = kube.pod_events
            assert (ns, name, uid, reason, warning) == ("ml", "greedy", uid_of(pods[0]), REASON_VRAM_OVERUSE, True)
            assert message.endswith(f"its process {FAKE_PID_BASE} (6Gi) was killed")
            assert [e[1:] for e in kube.node_events if e[1] == REASON_VRAM_OVERUSE] == [
                (REASON_VRAM_OVERUSE, message, True)
            ]
            killed = daemon.metrics.registry.get_sample_value(
                "tf_device_plugin_vram_overuse_total", {"outcome": "killed"}
            )
            assert killed == 1

    run(scenario())


def test_a_process_whose_kill_failed_is_not_tried_again_until_it_leaves_the_drivers_list() -> None:
    metrics, reports = PluginMetrics(), []
    killer = Killer(refuse="not permitted")
    guard = VramGuard(OveruseAction.KILL, TOLERANCE, killer, metrics, lambda found, message: reports.append(message))
    over = row(6 * GIB)
    listed = attribution(over, holders(over, (4242, 6 * GIB)))
    gone = attribution(row(0), {})

    async def passes(*found: Attribution) -> None:
        for f in found:
            await guard.enforce(f)

    run(passes(listed, listed, listed, listed))
    assert len(reports) == 1
    run(passes(gone, listed, listed))  # it left the list: a PID listed again may be another process
    assert len(reports) == 2


@pytest.mark.parametrize(("given", "said"), [("lots", "not a Kubernetes quantity"), ("-1Gi", "must not be negative")])
def test_a_tolerance_that_is_not_a_quantity_of_bytes_is_refused_naming_the_flag(given: str, said: str) -> None:
    with pytest.raises(ValueError, match="vram_overuse_tolerance") as refused:
        PluginSettings(node_name="n", vram_overuse_tolerance=given)
    assert said in str(refused.value)
    assert PluginSettings(node_name="n").vram_tolerance == 512 * MIB


def test_in_the_plugin_report_only_kills_nothing_and_says_so_once_and_off_samples_nothing(tmp_path: Path) -> None:
    """The same greedy pod under --vram-overuse=report: its process stays, one Event each on the pod and the node,
    counted as reported; under off (and --metrics-port=0) the sampler does not even run."""
    pod = make_pod("greedy", namespace="ml", alloc=None, phase="Running")
    pod["metadata"]["annotations"]["tensor-fusion.ai/allocation"] = allocation(
        uid_of(pod), gpus=(grant(GPU0, vram=4 * GIB),)
    )
    script = [{"pod": "greedy", "container": "main", "gpu": 0, "vramMiB": 6144}]

    async def scenario(action: str) -> tuple[FakeKube, Daemon]:
        kube = FakeKube([pod])
        path = gpu_file(tmp_path / f"{action}.yaml")
        async with plugin(tmp_path, kube, path, usage_interval=0.05, vram_overuse=action) as (daemon, _):
            gpu_file(path, usage=script)
            await asyncio.sleep(0.5)  # ten passes
            await daemon.node_events.drain()
            return kube, daemon

    kube, daemon = run(scenario("report"))
    assert [p.pid for p in daemon.probe.processes(GPU0, 0).processes] == [FAKE_PID_BASE]
    assert [e[3] for e in kube.pod_events] == [REASON_VRAM_OVERUSE]
    assert kube.pod_events[0][4].endswith("reported only (--vram-overuse=report)")
    assert [e[1] for e in kube.node_events if e[1] == REASON_VRAM_OVERUSE] == [REASON_VRAM_OVERUSE]
    counts = {
        o.value: daemon.metrics.registry.get_sample_value(VRAM_OVERUSE.name, {"outcome": o.value}) for o in Outcome
    }
    assert counts == {"killed": 0, "gone": 0, "kill_failed": 0, "reported": 1}

    kube, daemon = run(scenario("off"))
    assert daemon.vram_guard is None and daemon.sampler.latest is None  # no pass ran
    assert kube.pod_events == []
