"""HAMi-core's source made ready for the plugin image: its compute limiter fixed so that `soft` holds its cap
(``changes``), applied to a copy before the image's build stage compiles it (``python -m device_plugin.hami_build``).
Standard library only: it runs in a build stage with nothing of the project installed."""
