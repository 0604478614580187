"""Exits at once with argv[1] as status on every rank; with ``kill RANK`` that rank SIGKILLs
itself and the others sleep until stopped (field case C9)."""

import os
import signal
import sys
import time

if sys.argv[1] == "kill":
    if os.environ["RANK"] == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
sys.exit(int(sys.argv[1]))
