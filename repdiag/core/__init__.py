"""The shared core: config, errors, registry, runtime, GPU slots, stores, SLURM, inspect, CLI."""
