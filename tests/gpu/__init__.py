"""Tests of the GPU check and of device placement (run on the CPU)."""
