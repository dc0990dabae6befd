"""`python -m keda_gpu_scaler` runs the command line."""

import sys

from keda_gpu_scaler.cli import main

sys.exit(main())
