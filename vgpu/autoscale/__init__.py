"""The autoscaling recommender's pure core: config, usage histograms and one decision function per layer.

A WorkloadProfile's ``autoScalingConfig`` has three layers — ``autoSetLimits`` (burst the TFLOPS/VRAM
limit in place), ``autoSetRequests`` (move the reserved baseline to a usage percentile) and
``autoSetReplicas`` (add GPUs by adding replicas). Everything here is pure: no clock (every function
takes ``now``), no I/O, no Kubernetes, so the controller that applies the decisions, ``tfctl`` and the
tests all compute the same answer from the same inputs. See ``docs/autoscaling.md``.
"""
