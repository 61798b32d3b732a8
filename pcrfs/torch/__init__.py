"""Optional PyTorch helpers (install the `torch` extra): GPU-friendly L3 decoding."""
