"""Node-local hand-off receipts (``--receipts-file``): no pod write, and the same answers as receipts on the pods —
a pod is served once, recognised when the kubelet allocates it again after a restart, its grant proven at
PreStart — and a pod's receipt leaves the file when the pod leaves the node."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from device_plugin.cluster.pod_cache import PodCache
from device_plugin.cluster.receipts import ReceiptFile
from device_plugin.gpus.slices import slice_id
from tests.device_plugin.fakes import GPU0, GPU1, FakeKube, allocation, gpu_file, grant, make_pod, uid_of
from tests.device_plugin.harness import plugin, run
from tests.device_plugin.kubelet import TestKubelet
from vgpu.contract.allocation import decode_handoff
from vgpu.names import Env, SystemAnnotation

ALLOC = SystemAnnotation.ALLOCATION.value


async def kept(path: Path, uid: str, timeout: float = 5.0) -> dict[str, tuple[str, ...]]:
    """The devices the node's receipts file records for pod ``uid`` (waiting for it to be written)."""
    deadline = time.monotonic() + timeout
    while (text := ReceiptFile(path).load().get(uid)) is None:
        assert time.monotonic() < deadline, f"no hand-off receipt for {uid} in {path}"
        await asyncio.sleep(0.01)
    receipt = decode_handoff(text)
    assert receipt.pod_uid == uid
    return dict(receipt.devices)


def test_receipts_stay_on_the_node_and_serve_a_restarted_plugin(tmp_path: Path) -> None:
    old = make_pod("old")
    old["metadata"]["annotations"][ALLOC] = allocation(uid_of(old), gpus=[grant(GPU1, index=1)])
    new, stranger = make_pod("new"), make_pod("stranger")
    kube = FakeKube([old, new, stranger])
    book = tmp_path / "state" / "receipts.json"

    async def scenario() -> None:
        kubelet = TestKubelet(tmp_path)
        await kubelet.start()
        gpus = gpu_file(tmp_path / "gpus.yaml")
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet, receipts_file=str(book)) as (daemon, _):
            await kubelet.allocate(slice_id(GPU1, 3), pod="old")
            assert await kept(book, uid_of(old)) == {"main": (slice_id(GPU1, 3),)}
            held = daemon.cache.get(uid_of(old))
            assert held is not None and held.handoff is not None  # the lookup reads it as a receipt
        assert kube.pod_patches == []  # nothing written on any pod
        assert kube.annotation(uid_of(old), SystemAnnotation.HANDOFF.value) is None
        kubelet.records[("default", "stranger")] = {"main": (slice_id(GPU0, 1),)}
        async with plugin(tmp_path, kube, gpus, kubelet=kubelet, receipts_file=str(book)):
            # "old" is known to be handed over (else "new", of the same size, would be ambiguous beside it).
            kube.annotate(uid_of(new), ALLOC, allocation(uid_of(new)))
            fresh = await kubelet.allocate(slice_id(GPU0, 0), pod="new")
            assert fresh.container_responses[0].envs[Env.TF_POD_NAME] == "new"
            assert await kept(book, uid_of(new)) == {"main": (slice_id(GPU0, 0),)}
            # After a node reboot the kubelet allocates the recorded IDs again: same pod, same answer.
            again = await kubelet.allocate(slice_id(GPU1, 3))
            assert again.container_responses[0].envs[Env.TF_POD_NAME] == "old"
            await kubelet.prestart(slice_id(GPU1, 3))  # its grant proven from the node's receipt
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await kubelet.prestart(slice_id(GPU0, 1))
            assert "no tensor-fusion grant is proven for pod default/stranger" in (err.value.details() or "")
        assert kube.pod_patches == []
        await kubelet.stop()

    run(scenario())


def test_a_pods_receipt_leaves_the_file_with_the_pod(tmp_path: Path) -> None:
    pod = make_pod("gone")
    pod["metadata"]["annotations"][ALLOC] = allocation(uid_of(pod))
    kube = FakeKube([pod])
    book = tmp_path / "receipts.json"

    async def scenario() -> None:
        async with plugin(tmp_path, kube, gpu_file(tmp_path / "gpus.yaml"), receipts_file=str(book),
                          reconcile_interval=0.05) as (_daemon, kubelet):  # fmt: skip
            await kubelet.allocate(slice_id(GPU0, 0), pod="gone")
            await kept(book, uid_of(pod))
            kube.delete(uid_of(pod))
            deadline = time.monotonic() + 5
            while uid_of(pod) in ReceiptFile(book).load():
                assert time.monotonic() < deadline, "the deleted pod's receipt stayed"
                await asyncio.sleep(0.02)

    run(scenario())


def test_an_unreadable_receipts_file_starts_from_none(tmp_path: Path) -> None:
    book = tmp_path / "receipts.json"
    book.write_text("{not json")
    assert ReceiptFile(book).load() == {}
    book.write_text(json.dumps({"uid": 7}))
    assert ReceiptFile(book).load() == {}
    ReceiptFile(book).save({"b": "2", "a": "1"})
    assert ReceiptFile(book).load() == {"a": "1", "b": "2"} and [p.name for p in tmp_path.iterdir()] == [book.name]


def test_a_rewritten_receipt_shows_at_once_and_a_pods_own_receipt_wins() -> None:
    """The reconcile loop rewrites a receipt the kubelet's PodResources contradicts: the record shows the new one
    at once (not at the pod's next change). A pod carrying a receipt of its own (an earlier plugin's) keeps it."""

    async def scenario() -> None:
        cache = PodCache()
        local, annotated = make_pod("local"), make_pod("annotated")
        annotated["metadata"]["annotations"][SystemAnnotation.HANDOFF.value] = "on-the-pod"
        cache.replace([local, annotated])
        for text in ("first", "rewritten"):
            cache.hold_receipt(uid_of(local), text)
            cache.hold_receipt(uid_of(annotated), text)
            record, own = cache.get(uid_of(local)), cache.get(uid_of(annotated))
            assert record is not None and record.handoff == text
            assert own is not None and own.handoff == "on-the-pod"

    run(scenario())
