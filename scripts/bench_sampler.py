"""Micro-benchmark (issue 10): time per sampling step of the old float-CDF sampler and the exact one.

Run: PYTHONPATH=src python scripts/bench_sampler.py (one CPU thread; medians of 5 interleaved repeats of 200 steps)."""
import time, torch
from dpinfer.mechanisms.sampler import sample_probs
from dpinfer.mechanisms.randomness import SecureRandom, SeededRandom

def old_sample_probs(probs, generator):  # the sampler before issue 10 (commit 33b3934)
    cdf = probs.cumsum(dim=-1)
    total = cdf[..., -1:]
    u = torch.rand(total.shape, dtype=cdf.dtype, generator=generator, device=cdf.device)
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)

torch.set_num_threads(1)
for K, V in [(1, 49152), (9, 49152)]:
    z = torch.randn(K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    p = torch.softmax(z, -1)
    cases = {"old (torch.Generator)": (old_sample_probs, torch.Generator().manual_seed(0)),
             "exact, secure": (sample_probs, SecureRandom()), "exact, seeded": (sample_probs, SeededRandom(0)),
             "exact, torch.Generator": (sample_probs, torch.Generator().manual_seed(0))}
    res = {name: [] for name in cases}
    for _ in range(5):  # interleaved repeats, median (the machine is shared)
        for name, (f, g) in cases.items():
            for _ in range(10): f(p, g)
            n = 200; t = time.perf_counter()
            for _ in range(n): f(p, g)
            res[name].append((time.perf_counter() - t) / n * 1e6)
    for name, v in res.items():
        print(f"K={K} V={V} {name}: {sorted(v)[2]:.0f} us/step (median of 5)")
