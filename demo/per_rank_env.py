"""Run a demo script under the agent with environment settings that differ per rank, as on a
cluster whose nodes are configured differently:

    PER_RANK_ENV='{"1": {"TORCHINDUCTOR_CACHE_DIR": "/tmp/cold"}}' \
        torchrun --nproc-per-node 3 demo/per_rank_env.py demo/ddp_job.py --steps 4

Launch it with torchrun directly (not via `-m agents run`): the settings are applied before torch
and the agent load, so rank_start reports what each rank really used (cache directories, Inductor
settings).
"""

import json
import os
import sys

os.environ.update(json.loads(os.environ.get("PER_RANK_ENV", "{}")).get(os.environ["RANK"], {}))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agents.cli import main  # noqa: E402

sys.exit(main(["run", *sys.argv[1:]]))
