"""The autoscaler wing: applies autoSetLimits, autoSetRequests and autoSetReplicas from inside the extender.

The decisions are the pure recommender's (``vgpu.autoscale``); this package reads the cache and the device
plugins' usage, writes allocations, HorizontalPodAutoscalers and checkpoints, and reports in workload status.
"""
