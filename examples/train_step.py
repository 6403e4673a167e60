"""Training steps of a tiny KDA block through k3compile.ops' differentiable chunk_kda, captured by
torch.compile(fullgraph=True).

    python examples/train_step.py                      # CPU: Triton's interpreter, small dims (~1 min)
    python examples/train_step.py --steps 200 --heads 4 --dim 64 --tokens 1024   # on a GPU
    python examples/train_step.py --eager              # without torch.compile

A block of the shape a K3-style model trains: q, k, v, gate and beta projections of the hidden
states, KDA (q/k L2-normalised and the gate computed in the kernel from A_log and dt_bias, beta
as logits: fla's options), an output projection and a residual. The task is synthetic: predict
the hidden state of the next token of a random sequence made by a fixed linear recurrence. The
optimizer steps go through the compiled layer's custom op, whose backward is the derived
chunk_backward (docs/backward.md). The loss and its backward are one torch.compile(fullgraph=True)
graph each (a graph break is an error); where the backend cannot build its code (inductor without
a C++ compiler) the script says why and traces the same graphs with the aot_eager backend, which
runs them with eager kernels. It reports the loss before and after, and exits 1 if it did not go
down or a gradient is not finite.
"""

from __future__ import annotations

import argparse
import os
import sys


def usable_backend(torch, backend: str, device: str) -> str:
    """`backend` if it builds a tiny graph's code here, else aot_eager (the same graphs, run by
    eager kernels), with the reason printed: inductor needs a C++ compiler on the CPU."""
    try:
        torch.compile(lambda x: x + 1, fullgraph=True, backend=backend)(torch.ones(2, device=device))
    except torch._dynamo.exc.BackendCompilerFailed as error:
        reason = str(error.inner_exception).strip().splitlines()[0]
        print(f"torch.compile's {backend} backend cannot build its code here ({reason}); tracing the same "
              "graphs with backend='aot_eager', which runs them with eager kernels (--eager: no torch.compile)")
        return "aot_eager"
    return backend


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16, help="head_k_dim = head_v_dim")
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--lr", type=float, default=3e-2)
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend")
    parser.add_argument("--eager", action="store_true", help="run the steps eagerly, without torch.compile")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before k3compile imports triton
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter is fp32-only
    from k3compile.ops.kda import chunk_kda

    torch.manual_seed(0)
    H, D = args.heads, args.dim
    hidden = H * D

    class KDABlock(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
            self.gate = torch.nn.Linear(hidden, hidden, bias=False)
            self.beta = torch.nn.Linear(hidden, H, bias=False)
            self.A_log = torch.nn.Parameter(torch.zeros(H))
            self.dt_bias = torch.nn.Parameter(torch.zeros(H * D))
            self.out = torch.nn.Linear(hidden, hidden, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.reshape(B, T, H, D) for t in self.qkv(x).chunk(3, dim=-1))
            g = self.gate(x).reshape(B, T, H, D)
            o, _ = chunk_kda(q.to(dtype), k.to(dtype), v.to(dtype), g.to(dtype), self.beta(x).to(dtype),
                             A_log=self.A_log, dt_bias=self.dt_bias, use_qk_l2norm_in_kernel=True,
                             use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
            return x + self.out(o.reshape(B, T, hidden).to(x.dtype))

    # the data: x_{t+1} = tanh(M x_t) + noise, a fixed M
    M = torch.randn(hidden, hidden) / hidden ** 0.5
    x = [torch.randn(2, hidden)]
    for _ in range(args.tokens):
        x.append(torch.tanh(x[-1] @ M.T) + 0.1 * torch.randn(2, hidden))
    sequence = torch.stack(x, dim=1).to(device)
    inputs, targets = sequence[:, :-1], sequence[:, 1:]

    block = KDABlock().to(device)
    optimizer = torch.optim.Adam(block.parameters(), lr=args.lr)

    def loss_of(inputs, targets):
        return torch.nn.functional.mse_loss(block(inputs), targets)

    mode = "eager"
    if not args.eager:
        backend = usable_backend(torch, args.backend, device)
        loss_of = torch.compile(loss_of, fullgraph=True, backend=backend)
        mode = f"torch.compile(fullgraph=True, backend={backend!r})"
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = loss_of(inputs, targets)
        loss.backward()
        bad = [n for n, p in block.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
        if bad:
            print(f"step {step}: no finite gradient for {', '.join(bad)}")
            return 1
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.4f}")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps ({device}, {dtype}, {mode})")
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
