"""Run demo/ddp_job.py under the agent with a per-rank Inductor cache: COLD_RANK gets COLD_CACHE,
the others WARM_CACHE. Launch it with torchrun directly (not via `-m agents run`): the cache
directory is set before the agent attaches, so rank_start reports the directory really used."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from agents.cli import main  # noqa: E402

rank = os.environ["RANK"]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["COLD_CACHE" if rank == os.environ["COLD_RANK"] else "WARM_CACHE"]
sys.exit(main(["run", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_job.py"), *sys.argv[1:]]))
