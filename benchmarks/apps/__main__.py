"""`python -m benchmarks.apps [--mode quick|full] [--with-vllm] ...`: see benchmarks/apps/run.py."""

import sys

from benchmarks.apps.run import main

sys.exit(main())
