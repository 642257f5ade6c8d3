"""Usage: which pod and container each GPU process belongs to, and the node's per-container samples."""
