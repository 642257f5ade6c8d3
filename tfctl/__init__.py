"""``tfctl``: the operator's command line: resolve and explain pods, plan capacity, ``top`` and ``autoscale`` views.

It reads the cluster through ``tf_shell.kube.reads`` and the extender's public ``/explain`` endpoint,
and plans with the pure scheduling core (``vgpu.scheduling``); it never imports another program.
"""
