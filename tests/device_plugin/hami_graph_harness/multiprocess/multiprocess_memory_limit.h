/* Stand-in for HAMi-core's multiprocess/multiprocess_memory_limit.h in the graph-launch harness. */
void pre_launch_kernel(void);
