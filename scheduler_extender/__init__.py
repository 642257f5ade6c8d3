"""``tf-extender``: the kube-scheduler extender (filter, prioritize, bind, preempt), with the workload autoscaler."""
