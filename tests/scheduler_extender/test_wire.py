"""The prioritize reply written as text (``wire.host_priorities_json``): the same JSON array as the list of
HostPriority entries would encode to, in the same order, for node names of any characters."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from scheduler_extender.wire import HostPriority, host_priorities_json

DNS_NAMES = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
ANY_NAMES = st.text(max_size=12)  # quotes, backslashes, control and non-ASCII characters: the escaped way


@given(st.dictionaries(DNS_NAMES | ANY_NAMES, st.integers(0, 10), max_size=30), st.booleans())
def test_the_reply_is_every_host_with_its_score_in_order(scores: dict[str, int], tie: bool) -> None:
    if tie:
        scores = dict.fromkeys(scores, 10)
    reply = json.loads(host_priorities_json(scores))
    assert [HostPriority.model_validate(entry) for entry in reply] == [
        HostPriority(Host=host, Score=score) for host, score in scores.items()
    ]
    assert all(set(entry) == {"Host", "Score"} for entry in reply)
