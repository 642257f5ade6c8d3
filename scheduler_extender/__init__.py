"""The scheduler side: the kube-scheduler extender (filter, prioritize, bind, preempt), the webhook and the CLI."""
