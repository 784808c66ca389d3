"""`python -m benchmarks.cluster`: see benchmarks/cluster/__init__.py."""

import sys

from benchmarks.cluster import main

sys.exit(main())
