"""The extender's Kubernetes adapters: the only package allowed to import ``kubernetes``.

Everything else talks to the cluster through the small ports these modules implement, so the
scheduling core, the webhook's decision and the HTTP shells test without a cluster.
"""
