"""Starts a child process, as a data loader worker would, records its pid in
``argv[1]/child-<RANK>.pid``, and sleeps until stopped. Rank 0 prints ``children started`` once
every rank has recorded its child."""

import os
import subprocess
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
child = subprocess.Popen(["sleep", "300"])
pid_file = folder / f"child-{os.environ['RANK']}.pid"
pid_file.with_suffix(".tmp").write_text(str(child.pid))
pid_file.with_suffix(".tmp").replace(pid_file)
if os.environ["RANK"] == "0":
    while len(list(folder.glob("child-*.pid"))) < int(os.environ["WORLD_SIZE"]):
        time.sleep(0.1)
    print("children started", flush=True)
time.sleep(300)
