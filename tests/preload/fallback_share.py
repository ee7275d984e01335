# An unmodified Python program with two models under SWAPNET_BUDGET + SWAPNET_CONTROL: after
# both ran swapped, the second is given inputs where swapnet cannot run it (the meta device,
# standing in for a second GPU), so it runs as loaded normally from then on; a budget set at run
# time (swapnet ctl) then goes to the first alone. Prints the first model's output hash (the
# same with and without the preload) and, on stderr, what ctl answered and the status it gave.
#   python3 fallback_share.py A.pt B.pt N,C,H,W SWAPNET_CLI BUDGET
import hashlib
import os
import subprocess
import sys

import torch

a, b = torch.jit.load(sys.argv[1]), torch.jit.load(sys.argv[2])
x = torch.randn(*[int(d) for d in sys.argv[3].split(",")], generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    a(x), b(x)
    try:  # as loaded normally: its weights go to meta too (libtorch 1.13 refuses that, 2.x may not)
        b(x.to("meta"))
        print("meta forward ran", file=sys.stderr)
    except Exception:
        print("meta forward failed", file=sys.stderr)
    sock = os.environ.get("SWAPNET_CONTROL")
    if sock:
        ctl = [sys.argv[4], "ctl", "--socket", sock]
        print("answer", subprocess.run(ctl + ["budget", sys.argv[5]], capture_output=True, text=True).stdout.strip(),
              file=sys.stderr)
    out = a(x)
    if sock:
        print("status", subprocess.run(ctl + ["status"], capture_output=True, text=True).stdout.strip(), file=sys.stderr)
print("output", hashlib.sha256(out.contiguous().numpy().tobytes()).hexdigest()[:16])
