# An unmodified PyTorch program (Debian's python3-torch, which dlopens libtorch after the
# preload has started), run by preload_python_test.sh with and without LD_PRELOAD: prints one
# line per part with a hash of every output byte, so the two runs can be compared line by line.
#   python3 torch_program.py MODEL.pt
import hashlib
import os
import sys
import threading

import torch


def digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(str(t.dtype).encode() + str(tuple(t.shape)).encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


torch.manual_seed(0)
torch.set_num_threads(2)

# Tensors from ops.
a = torch.randn(3, 5)
b = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
print("ops", digest(a, a @ a.t(), b.sum(dim=1), torch.ones(2).sum()))

# torch.jit.load + forward.
model = torch.jit.load(sys.argv[1])
model.eval()
x = torch.randn(1, 3, 224, 224)
with torch.no_grad():
    y = model(x)
print("jit", digest(y))

# torch.nn modules, forward and backward.
net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 4))
inp = torch.randn(2, 3, 8, 8)
out = net(inp)
out.sum().backward()
print("nn", digest(out, net[0].weight.grad, net[3].bias.grad))


# Threads allocating and freeing tensors at once (as DataLoader's pin/prefetch threads do), and
# a DataLoader with worker processes (fork, while other threads hold tensors).
class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, 4, generator=g) ** 2


results = [None] * 4


def work(k):
    g = torch.Generator().manual_seed(100 + k)
    acc = torch.zeros(64, 64)
    for _ in range(200):
        t = torch.randn(64, 64, generator=g)
        acc += t @ t
    results[k] = acc


threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
loader = torch.utils.data.DataLoader(Squares(), batch_size=4, num_workers=2)
batches = [batch for batch in loader]
for t in threads:
    t.join()
print("threads", digest(*results))
print("dataloader", digest(*batches))

# A bare fork: the child allocates and exits; the parent goes on.
pid = os.fork()
if pid == 0:
    c = torch.randn(100, 100)
    os._exit(0 if float((c @ c).abs().sum()) > 0 else 1)
_, status = os.waitpid(pid, 0)
print("fork", os.WIFEXITED(status) and os.WEXITSTATUS(status))
