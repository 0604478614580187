"""The rank given as argv[1] prints what PyTorch prints for a GPU with an uncorrectable ECC
error and exits 1; the others sleep until stopped (issue 35, field case C34 standalone)."""

import os
import sys
import time

if os.environ["RANK"] == sys.argv[1]:
    print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr,
          flush=True)
    print("CUDA kernel errors might be asynchronously reported at some other API call, so the "
          "stacktrace below might be incorrect.", file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(120)
