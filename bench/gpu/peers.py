"""PyTorch peers for the bench/gpu figures, run on the device machine: the latent expert FFN
through torch._grouped_mm (gate/up, SiTU-GLU, down), and whether flash-linear-attention (fla)
is installed for a KDA peer. Prints "RESULT ..." lines like the C benchmarks."""
import torch

def timeit(fn, it=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(it):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / it

try:
    import fla  # noqa: F401
    print("RESULT peer_fla installed", getattr(fla, "__version__", "?"))
except Exception as e:  # noqa: BLE001
    print("RESULT peer_fla not installed (%s)" % type(e).__name__)

def situ(a, u, b1=4.0, b2=25.0):
    return (b1 * torch.tanh(a / b1) * torch.sigmoid(a)) * (b2 * torch.tanh(u / b2))

for E, tpe, l, w in [(64, 128, 1024, 512), (64, 512, 1024, 512), (16, 2048, 2048, 1024)]:
    n = E * tpe
    x = torch.randn(n, l, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(E, 2 * w, l, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(E, l, w, device="cuda", dtype=torch.bfloat16) * 0.02
    offs = torch.arange(1, E + 1, device="cuda", dtype=torch.int32) * tpe
    flops = 6.0 * n * l * w

    def ffn():
        gu = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        h = situ(gu[:, :w].float(), gu[:, w:].float()).to(torch.bfloat16)
        return torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)

    def mm_only():
        gu = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
        return torch._grouped_mm(gu[:, :w].contiguous(), w2.transpose(1, 2), offs=offs)

    ms = timeit(ffn)
    ms2 = [timeit(mm_only) for _ in range(3)]  # three times: the H200's clocks vary between runs
    print("RESULT peer_torch_grouped_ffn E=%d x %d l=%d w=%d: %.3f ms, %.1f TFLOP/s (GEMMs only: %.1f TFLOP/s;"
          " repeated: %s)" % (E, tpe, l, w, ms, flops / ms / 1e9, flops / ms2[0] / 1e9,
                              " / ".join("%.1f" % (flops / m / 1e9) for m in ms2[1:])))
