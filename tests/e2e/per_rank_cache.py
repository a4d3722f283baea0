"""Run demo/ddp_job.py with a per-rank Inductor cache: COLD_RANK gets COLD_CACHE, the others WARM_CACHE."""
import os
import runpy
import sys

rank = os.environ["RANK"]
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["COLD_CACHE" if rank == os.environ["COLD_RANK"] else "WARM_CACHE"]
script = os.path.join(os.path.dirname(__file__), "..", "..", "demo", "ddp_job.py")
sys.argv = [script, *sys.argv[1:]]
runpy.run_path(script, run_name="__main__")
