"""What tf-metrics serves: the per-pod and per-node samples of the usage feed's documents, as one snapshot.

Each document is digested into samples once, when it is fetched; after each pass the snapshot is
rebuilt from what the feed holds and swapped in whole, so serving never waits for a poll and a request
reads the last snapshot from memory.
"""

from __future__ import annotations

from tf_shell.usage_feed import UsageFeed
from vgpu.usage_samples import EMPTY, NodeSample, PodSample, Snapshot, snapshot

Digest = tuple[NodeSample, list[PodSample]]


class SamplePoller:
    """One :meth:`poll` is a pass of the feed; :attr:`snapshot` is what the last passes found."""

    def __init__(self, feed: UsageFeed[Digest]) -> None:
        self.feed = feed
        self.snapshot: Snapshot = EMPTY

    @property
    def polls(self) -> int:
        return self.feed.polls

    def poll(self) -> None:
        self.feed.poll()
        held = self.feed.held()
        self.snapshot = snapshot((node for node, _ in held), (pod for _, pods in held for pod in pods))

    def close(self) -> None:
        self.feed.close()
