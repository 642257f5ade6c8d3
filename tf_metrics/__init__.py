"""``tf-metrics``: the custom metrics API (``custom.metrics.k8s.io``) for GPU pods, from the device plugins.

A program of its own, not a route of the extender: the HPA controller polls every autoscaled
workload's metric every 15 s, and that load, or a stall behind it, must never reach a scheduling
verb. ``api`` is pure; ``auth`` judges the aggregator's requests; ``app`` and ``main`` are the HTTP
shell over the shared usage feed (``tf_shell.usage_feed``).
"""
