"""The cluster side: the plugin's Kubernetes port and adapter, the node's pods (list–watch into a cache),
the hand-off receipt, the node inventory it publishes and the node Events it records."""
