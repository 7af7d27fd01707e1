"""Deployment recipes: Kubernetes manifests and SLURM job scripts for a run config."""
