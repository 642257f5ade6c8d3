"""The GPUs: what a GPU is and how it is probed (NVML or a fake), their health, virtual slices and the board
that is the one source for ListAndWatch, Allocate and the inventory."""
