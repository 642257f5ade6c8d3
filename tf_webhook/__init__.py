"""``tf-webhook``: the mutating admission webhook: TensorFusion pod annotations in, a normalised, schedulable pod out.

The decision (``decision.decide``) is a pure function of the AdmissionReview and what the cluster
holds (profiles, pools, workloads, read through the ``cluster.AdmissionReads`` port); the FastAPI
app and the Kubernetes reads (``kube``) are thin shells around it.
"""
