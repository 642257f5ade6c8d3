"""The kubelet side: the gRPC servicer, registration and restarts, Allocate's decision and its proof."""
