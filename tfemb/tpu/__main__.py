"""`python -m tfemb.tpu MODULE:ATTR --num-replicas N ...`: the TPU plan."""

import sys

from tfemb.tpu.planner import cli

sys.exit(cli.main())
