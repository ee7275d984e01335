# An unmodified PyTorch program: torch.jit.load, forward twice on a seeded input, a hash of every
# output byte and whether the two runs agree on stdout, peak RSS (VmHWM) on stderr. The Python
# twin of jit_forward.cpp, run by transparent_test.sh. WHERE puts the model on the GPU as
# programs do: cuda-map loads it there (map_location="cuda"), cuda-to moves it (.to("cuda")); the
# input goes there too, outputs are hashed after .cpu(), and the GPU memory (PyTorch's peak
# allocated, and the device's in use at the end: cudaMemGetInfo) goes to stderr.
#   python3 jit_forward.py MODEL.pt N,C,H,W [cpu|cuda-map|cuda-to]
import hashlib
import sys

import torch


def flat(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for e in v for t in flat(e)]
    if isinstance(v, dict):
        return [t for k in v for t in flat(v[k])]
    return []


where = sys.argv[3] if len(sys.argv) > 3 else "cpu"
if where not in ("cpu", "cuda-map", "cuda-to"):
    sys.exit("jit_forward.py: %r is not cpu, cuda-map or cuda-to" % where)
torch.manual_seed(0)
m = torch.jit.load(sys.argv[1], map_location="cuda" if where == "cuda-map" else None)
if where == "cuda-to":
    m = m.to("cuda")
m.eval()
x = torch.randn(*[int(d) for d in sys.argv[2].split(",")])
if where != "cpu":
    x = x.to("cuda")
with torch.no_grad():
    a, b = m(x), m(x)
h = hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in flat(a))).hexdigest()[:16]
same = all(torch.equal(p, q) for p, q in zip(flat(a), flat(b)))
print("output %s same=%d" % (h, int(same)))
with open("/proc/self/status") as f:
    hwm = [line.split()[1] for line in f if line.startswith("VmHWM:")][0]
print("vm_hwm_kb", hwm, file=sys.stderr)
if where != "cpu":
    free, total = torch.cuda.mem_get_info()
    print("gpu_peak_allocated_mb", torch.cuda.max_memory_allocated() >> 20, file=sys.stderr)
    print("gpu_used_mb", (total - free) >> 20, file=sys.stderr)
