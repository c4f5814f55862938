import sys

try:
    from device_bench.runner import main
except ImportError as e:  # numpy missing: the one package the runner cannot start without
    print(f"device_bench: error: {e.name or e} is not installed for {sys.executable}; pip install numpy tokenizers "
          f"and a runtime there (or let the harness create a virtual environment: venv: true)", file=sys.stderr)
    sys.exit(1)

sys.exit(main())
