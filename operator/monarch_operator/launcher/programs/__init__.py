"""Stage 3, programs on the meshes: the job (trainer and reference proc meshes) behind the
public API, the built-in roles example, SPMD (torchrun-compatible) mode and user programs."""
