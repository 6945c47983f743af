"""Device meshes, sharding specs and axis names: the one place that decides data placement."""
