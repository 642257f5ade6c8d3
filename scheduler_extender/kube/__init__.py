"""The extender's Kubernetes adapter: which API each gateway method calls, with which body.

Everything else talks to the cluster through the ``scheduler_extender.gateway`` port, so the
extender's logic and HTTP shell test without a cluster.
"""
