"""The sections of bench/gpu_check.py, one module each; common.py holds what they share."""
