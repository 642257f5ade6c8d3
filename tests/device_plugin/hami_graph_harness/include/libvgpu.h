/* Stand-in for HAMi-core's include/libvgpu.h in the graph-launch harness. */
void ensure_post_init(void);
