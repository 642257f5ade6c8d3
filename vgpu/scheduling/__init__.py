"""Pure scheduling: snapshots in, decisions and reasons out. No Kubernetes, HTTP, clock or threads."""
