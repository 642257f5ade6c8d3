"""``tf-metrics``: the custom metrics API (``custom.metrics.k8s.io``) for GPU pods, from the device plugins.

A binary of its own, not a route of the extender: the HPA controller polls every autoscaled
workload's metric every 15 s, and that load, or a stall behind it, must never reach a scheduling
verb. It lives in this package for the extender's Kubernetes adapter (``scheduler_extender.kube``)
and the webhook's certificate reloader. ``samples`` and ``api`` are pure; ``collector`` polls the
plugins, ``auth`` judges the aggregator's requests, ``app`` and ``main`` are the HTTP shell.
"""
