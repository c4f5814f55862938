import sys

try:
    from device_bench.runner import main
except ImportError as e:  # numpy missing: the one package the runner cannot start without
    print(f"device_bench: error: {e.name or e} is not installed for {sys.executable}; pip install numpy tokenizers "
          f"and a runtime there (or, from edgekit's source tree, pip install \"./device_bench[onnx]\" or [tflite]; an ssh "
          f"target can set venv: true instead)", file=sys.stderr)
    sys.exit(1)

sys.exit(main())
