"""What kube-apiserver served during a benchmark case, per pod: requests by verb and resource, watch events sent.

The lean bind's price list (every API call a GPU pod costs beyond a plain pod) is read from the API server's
own counters before and after a case (``apiserver_request_total``, ``apiserver_watch_events_total``, and the
admission webhooks' calls), so it also names calls the benchmark does not know some process makes. A request
counts where it started (a WATCH once, at its start); a watch event counts once per watcher it is sent to.
Pure over the metrics text: throughput.py scrapes it.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

REQUESTS = "apiserver_request"  # the parser names a counter's family without its _total
WATCH_EVENTS = "apiserver_watch_events"
WEBHOOK_CALLS = "apiserver_admission_webhook_admission_duration_seconds"
SHOWN = 0.05  # per pod: less is left out (the cluster's own background: leases, controllers' resyncs)


def counts(text: str) -> dict[str, float]:
    """``VERB resource[/subresource]`` (``resource.group`` outside the core group), ``watch events <resource>``
    and ``webhook <name>`` → the counter's value, summed over the labels not in the key (codes, scopes)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = _key(family.name, sample.name, sample.labels)
            if key is not None:
                found[key] = found.get(key, 0.0) + sample.value
    return found


def _key(family: str, sample: str, labels: Mapping[str, str]) -> str | None:
    resource = labels.get("resource", "") or labels.get("kind", "")
    group = labels.get("group", "")
    named = f"{resource}.{group}" if group else resource
    if family == REQUESTS and sample.endswith("_total"):
        sub = labels.get("subresource", "")
        return f"{labels.get('verb', '?')} {named}{'/' + sub if sub else ''}"
    if family == WATCH_EVENTS and sample.endswith("_total"):
        return f"watch events {named}"
    if family == WEBHOOK_CALLS and sample.endswith("_count"):
        return f"webhook {labels.get('name', '?')}"
    return None


def per_pod(before: Mapping[str, float], after: Mapping[str, float], pods: int) -> dict[str, float]:
    """What each pod of a case cost, by key, largest first; keys under :data:`SHOWN` a pod are left out."""
    spent = {key: (value - before.get(key, 0.0)) / pods for key, value in after.items()}
    return {key: round(n, 2) for key, n in sorted(spent.items(), key=lambda kv: -kv[1]) if n >= SHOWN}


def beyond(case: Mapping[str, float], plain: Mapping[str, float]) -> dict[str, float]:
    """What a case's pod cost beyond a plain pod's, by key (only where it differs by :data:`SHOWN` or more)."""
    keys = dict.fromkeys([*case, *plain])
    extra = {key: round(case.get(key, 0.0) - plain.get(key, 0.0), 2) for key in keys}
    return {key: n for key, n in extra.items() if abs(n) >= SHOWN}
