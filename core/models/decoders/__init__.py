"""The decoder-only architectures, one file each. Every module here registers its
architectures (architectures.register) when imported, and the registry imports all of
them on first use: a new architecture is a new file here, nothing else."""
