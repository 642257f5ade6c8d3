"""The one way to talk to Kubernetes: shared vocabulary and errors (``api``), calls (``client``), the
list–watch loop (``list_watch``) and the reads tf-metrics and tfctl share (``reads``).

Each program's own adapter (``scheduler_extender.kube``, ``tf_webhook.kube``, ``device_plugin.cluster.kube``)
says which API it calls with which body, and makes the call through ``client``.
"""
