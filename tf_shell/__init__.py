"""The shell code every program may use and none owns: the floor between the programs and the pure domain.

The Kubernetes client with its one error taxonomy and list–watch loop (``kube``), the periodic
thread, strict JSON bodies, TLS certificate reload, the usage feed from the device plugins, settings
parsing into flags, the log format and the operator's catalog file. It imports no program.
"""
