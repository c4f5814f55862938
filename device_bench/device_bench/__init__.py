"""device_bench: run an exported edgekit model on the device and write a result JSON (see runner.py).
Imports neither edgekit nor torch: copy this folder to a device with numpy, tokenizers and one runtime."""
__version__ = "0.1.0"
